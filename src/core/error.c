#include "kvtier/error.h"

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
