// Clang thread-safety annotations (-Wthread-safety): the lock rules written into declarations.
// Under clang each macro is the attribute of the same name; elsewhere (gcc) it is nothing.
#pragma once

#if defined(__clang__)
#define PFB_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PFB_THREAD_ANNOTATION(x)
#endif

/// Marks a class as a lock ("capability") the analysis tracks.
#define PFB_CAPABILITY(name) PFB_THREAD_ANNOTATION(capability(name))
/// Marks an RAII class whose constructor acquires (or releases) a capability and whose destructor undoes it.
#define PFB_SCOPED_CAPABILITY PFB_THREAD_ANNOTATION(scoped_lockable)
/// Marks a data member that may be read or written only with `mu` held.
#define PFB_GUARDED_BY(mu) PFB_THREAD_ANNOTATION(guarded_by(mu))
/// Marks a function callable only with the named capabilities held (and still held on return).
#define PFB_REQUIRES(...) PFB_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
/// Marks a function that acquires the named capabilities (none named: `this`, or a scoped object's own).
#define PFB_ACQUIRE(...) PFB_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
/// Marks a function that releases the named capabilities (none named: `this`, or a scoped object's own).
#define PFB_RELEASE(...) PFB_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
/// Marks a function that must not be called with the named capabilities held (it takes them itself).
#define PFB_EXCLUDES(...) PFB_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
/// Turns the analysis off for one function; say why next to every use.
#define PFB_NO_THREAD_SAFETY_ANALYSIS PFB_THREAD_ANNOTATION(no_thread_safety_analysis)
