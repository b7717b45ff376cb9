"""The paper's pools (§1.1) by the names their store keys carry, so the sans-I/O cores
can name the pool an action writes without knowing how a store holds it
(dedupnet/adapters/storage/store.py does, and re-exports these names)."""

# Local host pools.
FINISH_URL = "finish_URL"
TASK_POOL = "task_pool"
URL_POOL = "URL_pool"
# Center host pools.
TASK_URL = "task_URL"
LOCAL_REDUCE_POOL = "local_reduce_pool"
DIST_REDUCE_POOL = "dist_reduce_pool"
#: A center's fingerprint sets: the URLs it admitted, the numbers it concluded.
ADMITTED = "admitted"
CONCLUDED = "concluded"
