#include "kvtier/error.h"
#include "error-int.h"

bool kvt__err_known(int err) {
    switch (err) {
#define KVT_ERR_KNOWN_(name, val, msg) case (val): return (val) != 0;
        KVT_ERRNO_MAP(KVT_ERR_KNOWN_)
#undef KVT_ERR_KNOWN_
    default: return false;
    }
}

const char *kvt_strerror(int err) {
    switch (err) {
#define KVT_ERR_MSG_(name, val, msg) case (val): return (msg);
        KVT_ERRNO_MAP(KVT_ERR_MSG_)
#undef KVT_ERR_MSG_
    default: return "unknown error";
    }
}

const char *kvt_err_name(int err) {
    switch (err) {
#define KVT_ERR_NAME_(name, val, msg) case (val): return "KVT_" #name;
        KVT_ERRNO_MAP(KVT_ERR_NAME_)
#undef KVT_ERR_NAME_
    default: return "KVT_UNKNOWN";
    }
}
