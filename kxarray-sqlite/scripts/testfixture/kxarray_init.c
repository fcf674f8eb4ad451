/*
** The SQLITE_EXTRA_INIT hook of the testfixture that scripts/testfixture.sh
** builds: SQLite calls kxarray_testfixture_init() at the end of every
** sqlite3_initialize(), in the test process and in every child it starts.
**
** With KXARRAY_TESTFIXTURE=<path of libkxarray_sqlite.so> in the
** environment it loads the kxarray extension (once per process, through a
** connection to ":memory:" on the unix VFS) and makes "kxarray" the default
** VFS, again after every sqlite3_shutdown()/sqlite3_initialize() pair (the
** unix VFS's sqlite3_os_init() makes itself the default again). It also
** hands the VFS the addresses of SQLite's I/O-error counters
** (sqlite3_io_error_pending and its siblings, os.c in a test build, the
** Tcl variables sqlite_io_error_pending...), so that the fault tests count
** and inject their errors in kxarray's operations as they do in
** os_unix.c's.
**
** Without the variable the hook does nothing: the same binary is the
** stock testfixture on the unix VFS, which the script compares against.
*/
#include "sqlite3.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

extern int sqlite3_io_error_pending;
extern int sqlite3_io_error_persist;
extern int sqlite3_io_error_hit;
extern int sqlite3_io_error_hardhit;
extern int sqlite3_io_error_benign;
extern int sqlite3_diskfull_pending;
extern int sqlite3_diskfull;

typedef void (*fault_counters_fn)(int*, int*, int*, int*, int*, int*, int*);

int kxarray_testfixture_init(const char *unused){
  const char *lib = getenv("KXARRAY_TESTFIXTURE");
  sqlite3_vfs *kx;
  (void)unused;
  if( lib==0 || lib[0]==0 ) return SQLITE_OK;
  kx = sqlite3_vfs_find("kxarray");
  if( kx==0 ){
    sqlite3 *db = 0;
    char *err = 0;
    fault_counters_fn counters;
    int rc = sqlite3_open_v2(":memory:", &db, SQLITE_OPEN_READWRITE, "unix");
    if( rc==SQLITE_OK ) rc = sqlite3_enable_load_extension(db, 1);
    if( rc==SQLITE_OK ) rc = sqlite3_load_extension(db, lib, 0, &err);
    if( rc!=SQLITE_OK ){
      fprintf(stderr, "kxarray_testfixture_init: loading %s: %s\n", lib,
              err ? err : (db ? sqlite3_errmsg(db) : "out of memory"));
      sqlite3_free(err);
      sqlite3_close(db);
      return rc;
    }
    sqlite3_close(db);
    counters = (fault_counters_fn)dlsym(RTLD_DEFAULT, "kxarray_sqlite_fault_counters");
    if( counters ){
      counters(&sqlite3_io_error_pending, &sqlite3_io_error_persist,
               &sqlite3_io_error_hit, &sqlite3_io_error_hardhit,
               &sqlite3_io_error_benign, &sqlite3_diskfull_pending,
               &sqlite3_diskfull);
    }
    kx = sqlite3_vfs_find("kxarray");
    if( kx==0 ) return SQLITE_ERROR;
  }
  return sqlite3_vfs_register(kx, 1);
}
