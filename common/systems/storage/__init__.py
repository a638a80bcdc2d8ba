"""Storage for training and inference (lab 11, section 7), one namespace for the lab (`from common.systems import
storage`); behind it:
- `files`: the scratch directory (a fresh folder under build/storage/, at most 1 GiB, removed also on failure; a
  clear StorageError for an unwritable directory or a full disk), seeded files, the page cache (`mincore`) and how a
  file is evicted from it (fsync + posix_fadvise DONTNEED, or O_DIRECT);
- `reads`: sequential reads from the page cache and from the device by block size and readers, random 4 KiB reads
  at queue depth 1 and 4 (IOPS, latency percentiles), each a time-based sample, and the fio job that measures the
  same;
- `checkpoints`: DeepSeek's recipe of a training state, bit-for-bit comparison, and torch.distributed.checkpoint
  sharded over gloo ranks with async_save overlapping training steps (the full profile), each read back bit for bit;
- `writer`: a trainer's own checkpoints -- serialised in memory, written durably (fsync, atomic rename, the
  directory fsynced), written by a background thread (lab 11's exercises 11.5 and 11.6), measured against the
  blocking save (the serialiser's rate and the disk's apart, the exposed seconds unclipped, the staging apart);
- `scale`: from one machine to 3FS's scale -- 3FS's published figures checked, DeepSeek-V3's checkpoint by lab 09/13's
  memory recipe, pre-training's token reads, the on-disk KV cache of DeepSeek's service (data/storage_3fs.json;
  the service's figures are lab 14's, data/deepseek_v3_service.json).

Part of `common.systems`: may import core, facts, kernels, moe, parallel and the other systems modules.
"""
from common.systems.storage.checkpoints import (
    BYTES_PER_PARAM,
    RECIPE,
    async_checkpoint_worker,
    bitwise_mismatches,
    hidden_fraction,
    measure_async_checkpoint,
    recipe_state,
    start_checkpoint_ranks,
    state_bytes,
)
from common.systems.storage.files import (
    DEFAULT_ROOT,
    GIB,
    KIB,
    MAX_SCRATCH_BYTES,
    MIB,
    Scratch,
    StorageError,
    cold_method,
    disk_full_is_clear,
    evict,
    file_system,
    o_direct_works,
    page_cache_fraction,
    scratch_dir,
    write_file,
)
from common.systems.storage.reads import (
    COLD_METHODS,
    RandomReads,
    Read,
    fio_command,
    random_reads,
    read_sequential,
    read_sweep,
    sample_random,
    sample_sequential,
)
from common.systems.storage.scale import (
    GB,
    TIB,
    checkpoint_seconds,
    fact,
    gbps_to_bytes,
    graysort,
    kv_bytes_per_token,
    kv_cache_reads,
    kvcache_peak_per_client,
    pretraining_reads,
    prefill_saved,
    read_per_node,
    service,
    source,
    token_id_bytes,
    v3_checkpoint,
    v3_checkpoint_seconds,
)
from common.systems.storage.writer import (
    AsyncCheckpointer,
    measure_checkpoints,
    save_checkpoint,
    to_bytes,
    train_step,
    write_durably,
)
