/* kvtier — everything public, in one include. */
#ifndef KVTIER_KVTIER_H
#define KVTIER_KVTIER_H

#include "kvtier/alloc.h"
#include "kvtier/cache.h"
#include "kvtier/cp.h"
#include "kvtier/error.h"
#include "kvtier/mem.h"
#include "kvtier/model.h"
#include "kvtier/radix.h"
#include "kvtier/stats.h"

#endif
