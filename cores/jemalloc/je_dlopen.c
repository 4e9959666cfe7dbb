/* je_hold (cores/jemalloc/je_hold.c), with jemalloc loaded the way a plugin loads it: dlopen of the library JE_LIBRARY
 * names (a jemalloc built with --disable-initial-exec-tls, which is what makes that possible), RTLD_LOCAL, and
 * the blocks allocated through its entry points.  Each thread's tsd is then its block of the library's TLS
 * module, which its dynamic thread vector holds; a thread that never calls jemalloc has none.
 */
#define JE_DLOPEN
#include "je_hold.c"
