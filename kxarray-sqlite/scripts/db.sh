# Sourced by the shell benchmarks (cold-scan.sh, shell-selects.sh): the
# database they share and the kernel-cache drop.

# make_db DB ROWS: a table t(id INTEGER PRIMARY KEY, v BLOB) of ROWS rows
# of 400 random bytes (1,000,000 rows: about 456 MB), made once with the
# unix VFS and reused.
make_db() {
  local db=$1 rows=$2
  [ -f "$db" ] && return 0
  echo "making $db ($rows rows of 400 random bytes)..." >&2
  sqlite3 "$db.tmp" "PRAGMA page_size=4096; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);
    WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT $rows)
    INSERT INTO t SELECT x, randomblob(400) FROM c;"
  mv "$db.tmp" "$db"
}

# drop FILE: drop FILE from the kernel's page cache (posix_fadvise DONTNEED).
drop() {
  python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$1"
}
