//! File helpers shared by the loaders and savers.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::{NetworkError, Result};

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, fsync, rename.
/// A crash or a full disk leaves the old file as it was.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| NetworkError::InvalidInput(format!("{} is not a file path", path.display())))?;
    let tmp = dir.join(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(NetworkError::io(path, e));
    }
    // Make the rename itself durable where the platform allows opening a directory.
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads a whole file, naming it on failure.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| NetworkError::io(path, e))
}
