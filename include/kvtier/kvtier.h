/* kvtier — everything public, in one include. */
#ifndef KVTIER_KVTIER_H
#define KVTIER_KVTIER_H

#include "kvtier/alloc.h"
#include "kvtier/cache.h"
#include "kvtier/cp.h"
#include "kvtier/error.h"
#include "kvtier/hybrid.h"
#include "kvtier/keyed.h"
#include "kvtier/mem.h"
#include "kvtier/model.h"
#include "kvtier/net.h"
#include "kvtier/pd.h"
#include "kvtier/radix.h"
#include "kvtier/rng.h"
#include "kvtier/stats.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"
#include "kvtier/trace.h"
#include "kvtier/version.h"
#include "kvtier/xfer.h"

#endif
