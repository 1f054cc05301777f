/* kvtier._keyed_calls: the keyed cache's hot calls without ctypes.
 *
 * vLLM's offloading manager makes four or five calls into the keyed cache a
 * request, each of a few keys; through ctypes each spent more converting
 * arguments and making result buffers than the cache spent on the call
 * (docs/performance.md, "vLLM's offloading manager"). These functions take
 * the handle as an int and the keys packed as kvtier.keyed packs them
 * (bytes, 16 a key), and return plain Python values: kvtier.keyed's
 * _Ctypes makes the same calls, with the same checks and results, where
 * this module is not built.
 *
 * The module links against nothing: bind() hands it the addresses of the
 * functions of the library ctypes loaded, so its calls go to the one
 * library the package uses (KVTIER_LIB's included). Its caller holds the
 * handle's lock and passes the handle it got from it (this module cannot
 * tell a live handle from any other int, as ctypes cannot); every other
 * argument is checked here. The GIL stays held: each call is a short run
 * of C that never blocks, and giving the GIL up and back would cost about
 * what the call does. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "kvtier/error.h"
#include "kvtier/keyed.h"

#define KEY_BYTES ((size_t)sizeof(kvt_key128_t))
#define ON_STACK 64 /* pages and evicted keys kept on the stack up to this many */

/* The library's functions, typed by their own declarations (a changed
 * signature fails this build, not a call). */
static struct {
    __typeof__(kvt_keyed_prepare_store) *prepare;
    __typeof__(kvt_keyed_complete_store) *complete;
    __typeof__(kvt_keyed_pin) *pin;
    __typeof__(kvt_keyed_unpin) *unpin;
    __typeof__(kvt_keyed_touch) *touch;
    __typeof__(kvt_keyed_arc_touch) *arc_touch;
    __typeof__(kvt_keyed_arc_missed) *arc_missed;
    __typeof__(kvt_keyed_arc_finish) *arc_finish;
} fn;
#define F_COUNT ((Py_ssize_t)(sizeof(fn) / sizeof(void *)))

static int handle(PyObject *o, void **h) {
    if (!PyLong_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "expected an address (int)");
        return -1;
    }
    *h = PyLong_AsVoidPtr(o);
    if (*h == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a NULL address");
        return -1;
    }
    return 0;
}

/* Packed keys (bytes, a subclass too: its buffer's own size is read, not
 * what its __len__ says): *n of them. The checks and messages are
 * kvtier.keyed's (_Ctypes). */
static int keys_arg(PyObject *o, const char *what, const void **p, size_t *n) {
    if (!PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: expected packed keys (bytes), not %.200s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    size_t len = (size_t)PyBytes_GET_SIZE(o);
    if (len % KEY_BYTES) {
        PyErr_Format(PyExc_ValueError, "%s: %zu bytes is not a whole number of %zu-byte keys", what, len, KEY_BYTES);
        return -1;
    }
    *p = PyBytes_AS_STRING(o);
    *n = len / KEY_BYTES;
    return 0;
}

/* n packed scores, a uint64 a key. */
static int scores_arg(PyObject *o, size_t n, const void **p) {
    if (!PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError, "scores: expected packed scores (bytes), not %.200s", Py_TYPE(o)->tp_name);
        return -1;
    }
    size_t len = (size_t)PyBytes_GET_SIZE(o);
    if (len != n * sizeof(uint64_t)) {
        PyErr_Format(PyExc_ValueError, "scores: %zu bytes for %zu keys (a uint64 per key)", len, n);
        return -1;
    }
    *p = PyBytes_AS_STRING(o);
    return 0;
}

static int bound(void) {
    if (fn.prepare != NULL) return 0;
    PyErr_SetString(PyExc_RuntimeError, "kvtier._keyed_calls: bind() first");
    return -1;
}

static int args(const char *name, Py_ssize_t na, Py_ssize_t want) {
    if (na == want) return bound();
    PyErr_Format(PyExc_TypeError, "%s: %zd arguments, not %zd", name, want, na);
    return -1;
}

static PyObject *pages_list(const uint64_t *pages, size_t n) {
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l != NULL && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(pages[i]);
        if (v == NULL) Py_CLEAR(l);
        else PyList_SET_ITEM(l, (Py_ssize_t)i, v);
    }
    return l;
}

/* bind(addresses): the library's functions, in the order of fn's fields. */
static PyObject *bind(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != F_COUNT)
        return PyErr_Format(PyExc_TypeError, "bind: expected a tuple of %zd addresses", F_COUNT);
    void *got[F_COUNT];
    for (Py_ssize_t i = 0; i < F_COUNT; i++)
        if (handle(PyTuple_GET_ITEM(arg, i), &got[i]) != 0) return NULL;
    memcpy(&fn, got, sizeof(fn));
    Py_RETURN_NONE;
}

/* prepare(h, keys, scores, protect, room) -> (rc, pages, evicted): scores
 * None for none; room, the most keys the call may evict beyond its own
 * count (the cache's free-room target). pages (a list) and evicted (bytes,
 * 16 a key) are None unless rc is KVT_OK. */
static PyObject *prepare(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    void *h;
    const void *keys, *scores = NULL, *protect;
    size_t n, np;
    if (args("prepare", na, 5) || handle(a[0], &h) || keys_arg(a[1], "keys", &keys, &n) ||
        keys_arg(a[3], "protect", &protect, &np) || (a[2] != Py_None && scores_arg(a[2], n, &scores)))
        return NULL;
    size_t room = PyLong_AsSize_t(a[4]);
    if (room == (size_t)-1 && PyErr_Occurred()) return NULL;
    if (room > PY_SSIZE_T_MAX / KEY_BYTES - n) return PyErr_Format(PyExc_ValueError, "room: %zu", room);
    uint64_t pages_stack[ON_STACK], *pages = pages_stack;
    kvt_key128_t ev_stack[ON_STACK], *ev = ev_stack;
    size_t full = n + room, cap = ON_STACK, nev = 0;
    if (n > ON_STACK && (pages = PyMem_Malloc(n * sizeof(*pages))) == NULL) return PyErr_NoMemory();
    int rc;
    for (;;) {
        rc = fn.prepare(h, keys, scores, n, protect, np, pages, ev, cap, &nev);
        if (rc != KVT_ERANGE || cap >= full) break;
        /* more to evict than the stack holds: nothing changed; again with room for all */
        cap = full;
        if ((ev = PyMem_Malloc(cap * sizeof(*ev))) == NULL) {
            if (pages != pages_stack) PyMem_Free(pages);
            return PyErr_NoMemory();
        }
    }
    PyObject *out = NULL, *pl = NULL, *el = NULL;
    if (rc == KVT_OK && ((pl = pages_list(pages, n)) == NULL ||
                         (el = PyBytes_FromStringAndSize((const char *)ev, (Py_ssize_t)(nev * KEY_BYTES))) == NULL))
        goto done;
    out = Py_BuildValue("(iOO)", rc, pl ? pl : Py_None, el ? el : Py_None);
done:
    Py_XDECREF(pl);
    Py_XDECREF(el);
    if (pages != pages_stack) PyMem_Free(pages);
    if (ev != ev_stack) PyMem_Free(ev);
    return out;
}

/* complete(h, keys, ok) */
static PyObject *complete(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    void *h;
    const void *keys;
    size_t n;
    if (args("complete", na, 3) || handle(a[0], &h) || keys_arg(a[1], "keys", &keys, &n)) return NULL;
    int ok = PyObject_IsTrue(a[2]);
    if (ok < 0) return NULL;
    fn.complete(h, keys, n, ok);
    Py_RETURN_NONE;
}

/* pin(h, keys) -> (rc, pages or None) */
static PyObject *pin(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    void *h;
    const void *keys;
    size_t n;
    if (args("pin", na, 2) || handle(a[0], &h) || keys_arg(a[1], "keys", &keys, &n)) return NULL;
    uint64_t stack[ON_STACK], *pages = n > ON_STACK ? PyMem_Malloc(n * sizeof(*pages)) : stack;
    if (pages == NULL) return PyErr_NoMemory();
    int rc = fn.pin(h, keys, n, pages);
    PyObject *pl = rc == KVT_OK ? pages_list(pages, n) : NULL, *out = NULL;
    if (rc != KVT_OK || pl != NULL) out = Py_BuildValue("(iO)", rc, pl ? pl : Py_None);
    Py_XDECREF(pl);
    if (pages != stack) PyMem_Free(pages);
    return out;
}

/* The calls (h, keys) -> rc: unpin, arc_touch, arc_missed. */
static PyObject *keys_call(__typeof__(kvt_keyed_unpin) *f, const char *name, PyObject *const *a, Py_ssize_t na) {
    void *h;
    const void *keys;
    size_t n;
    if (args(name, na, 2) || handle(a[0], &h) || keys_arg(a[1], "keys", &keys, &n)) return NULL;
    return PyLong_FromLong(f(h, keys, n));
}

static PyObject *unpin(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    return keys_call(fn.unpin, "unpin", a, na);
}

static PyObject *arc_touch(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    return keys_call(fn.arc_touch, "arc_touch", a, na);
}

static PyObject *arc_missed(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    return keys_call(fn.arc_missed, "arc_missed", a, na);
}

/* touch(h, keys, scores) */
static PyObject *touch(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    void *h;
    const void *keys, *scores;
    size_t n;
    if (args("touch", na, 3) || handle(a[0], &h) || keys_arg(a[1], "keys", &keys, &n) || scores_arg(a[2], n, &scores))
        return NULL;
    fn.touch(h, keys, scores, n);
    Py_RETURN_NONE;
}

/* arc_finish(h, keys, flags) -> rc */
static PyObject *arc_finish(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    void *h;
    const void *keys, *flags;
    size_t n;
    if (args("arc_finish", na, 3) || handle(a[0], &h) || keys_arg(a[1], "keys", &keys, &n)) return NULL;
    if (!PyBytes_Check(a[2]) || (size_t)PyBytes_GET_SIZE(a[2]) != n)
        return PyErr_Format(PyExc_ValueError, "flags: expected %zu bytes, one a key", n);
    flags = PyBytes_AS_STRING(a[2]);
    return PyLong_FromLong(fn.arc_finish(h, keys, flags, n));
}

#define FAST(name, doc) {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL, doc}
static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(addresses): the library's functions the calls go to"},
    FAST(prepare, "prepare(h, keys, scores, protect, room) -> (rc, pages, evicted)"),
    FAST(complete, "complete(h, keys, ok)"),
    FAST(pin, "pin(h, keys) -> (rc, pages)"),
    FAST(unpin, "unpin(h, keys) -> rc"),
    FAST(touch, "touch(h, keys, scores)"),
    FAST(arc_touch, "arc_touch(h, keys) -> rc"),
    FAST(arc_missed, "arc_missed(h, keys) -> rc"),
    FAST(arc_finish, "arc_finish(h, keys, flags) -> rc"),
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvtier._keyed_calls",
                                    "The keyed cache's hot calls without ctypes (kvtier.keyed uses them).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__keyed_calls(void); /* (exported: the one symbol the module shows) */
PyMODINIT_FUNC PyInit__keyed_calls(void) {
    PyObject *m = PyModule_Create(&module);
    /* what bind() takes, by name, in fn's order: kvtier.keyed binds by these */
    PyObject *names = Py_BuildValue("(ssssssss)", "kvt_keyed_prepare_store", "kvt_keyed_complete_store",
                                    "kvt_keyed_pin", "kvt_keyed_unpin", "kvt_keyed_touch", "kvt_keyed_arc_touch",
                                    "kvt_keyed_arc_missed", "kvt_keyed_arc_finish");
    if (m == NULL || names == NULL || PyModule_AddObject(m, "FUNCTIONS", names) != 0) {
        Py_XDECREF(names);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
