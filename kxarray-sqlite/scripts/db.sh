# Sourced by the shell benchmarks (cold-scan.sh, shell-selects.sh): the
# database they share and the kernel-cache drop.

# make_db DB ROWS [scattered]: a table t(id INTEGER PRIMARY KEY, v BLOB) of
# ROWS rows of 400 random bytes (1,000,000 rows: about 456 MB), made once
# with the unix VFS and reused; with `scattered`, inserted in a random
# key order (the minstd generator's sequence, 48271^x mod 2^31 - 1:
# distinct keys), so the table's leaves lie out of key order in the file,
# as in a table filled in random order (400,000 rows: about 206 MB).
make_db() {
  local db=$1 rows=$2 key=x
  [ -f "$db" ] && return 0
  [ "${3:-}" = scattered ] && key=k
  echo "making $db ($rows rows of 400 random bytes, keys ${3:-sequential})..." >&2
  sqlite3 "$db.tmp" "PRAGMA page_size=4096; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);
    WITH RECURSIVE c(x, k) AS (SELECT 1, 48271 UNION ALL
      SELECT x + 1, k * 48271 % 2147483647 FROM c LIMIT $rows)
    INSERT INTO t SELECT $key, randomblob(400) FROM c;"
  mv "$db.tmp" "$db"
}

# drop FILE: drop FILE from the kernel's page cache (posix_fadvise DONTNEED).
drop() {
  python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$1"
}
