//! What the fuzz targets share: a scratch folder on tmpfs where each input is written as
//! the file a loader opens (the loaders take paths, and fuzzing them through their public
//! entry points tests the code users call), the split of one input into two files, and the
//! small model that optimizer states and adapters are loaded onto.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use rusting_brain::TransformerLm;

/// A folder private to this process, on tmpfs when the machine has one.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base =
            if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let dir = base.join(format!("rb-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the fuzz scratch folder");
        dir
    })
}

/// Writes `bytes` as `name` in the scratch folder (subfolders made as needed).
pub fn put(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch().join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("creating a scratch subfolder");
    }
    std::fs::write(&path, bytes).expect("writing the fuzz input");
    path
}

pub use rusting_brain_test_support::fuzz::{split, tiny_lm};

/// The input split in two and written as `names` in the scratch folder: their paths.
pub fn put_split(data: &[u8], names: [&str; 2]) -> [PathBuf; 2] {
    let (a, b) = split(data);
    [put(names[0], a), put(names[1], b)]
}

/// [`put_split`] for the two files of one folder: the folder.
pub fn put_folder(data: &[u8], names: [&str; 2]) -> PathBuf {
    let [_, b] = put_split(data, names);
    b.parent().expect("a folder").to_path_buf()
}

/// Runs a model that loaded on two tokens: what loaded must also run (or refuse with an
/// error), not crash later.
pub fn run(lm: &mut TransformerLm) {
    // The KV caches are as long as the context the file declares: a fuzzed context of
    // billions of positions would be gigabytes of cache; eight positions are enough here.
    let _ = lm.set_max_seq_len(lm.config().max_seq_len.min(8));
    let ids: Vec<u32> = (0..2).filter(|&i| (i as usize) < lm.config().vocab_size).collect();
    let mut caches = lm.new_kv_caches();
    let _ = lm.forward_cached(&ids, &mut caches);
}

/// Lends the fuzz model to `f`, built once: initialising it costs more than most inputs.
/// The loaders promise that a refused file changes nothing, so the model is kept after an
/// error and built afresh only after a load succeeded (`f` returns whether it did).
pub fn with_tiny_lm(f: impl FnOnce(&mut TransformerLm) -> bool) {
    static MODEL: Mutex<Option<TransformerLm>> = Mutex::new(None);
    let mut slot = MODEL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lm = slot.take().unwrap_or_else(tiny_lm);
    if !f(&mut lm) {
        *slot = Some(lm);
    }
}
