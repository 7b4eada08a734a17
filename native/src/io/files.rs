//! File helpers shared by the loaders and savers.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{NetworkError, Result};

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, fsync, rename.
/// A crash or a full disk leaves the old file as it was.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let (dir, tmp) = temporary_for(path)?;
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

/// Where a save into `dir/name` stages its bytes: `.{name}.tmp{pid}`, private to this
/// process so two processes saving the same path never mix their bytes. A process killed
/// mid-save leaves its temporary behind; on Linux the ones of processes that no longer run
/// are removed here, so repeated crashes do not pile up copies of a checkpoint. (A process
/// of another PID namespace saving the same path at that moment would get an error from
/// its rename, never a damaged file.)
pub(crate) fn temporary(dir: &Path, name: &str) -> PathBuf {
    let prefix = format!(".{name}.tmp");
    if cfg!(target_os = "linux") {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let file = entry.file_name();
            let Some(pid) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else {
                continue;
            };
            let dead = pid
                .parse::<u32>()
                .is_ok_and(|p| p != std::process::id() && !Path::new("/proc").join(pid).exists());
            if dead && Path::new("/proc/self").exists() {
                let path = entry.path();
                let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
            }
        }
    }
    dir.join(format!("{prefix}{}", std::process::id()))
}

/// The folder of the file `path` and the temporary a save into it stages its bytes in.
pub(crate) fn temporary_for(path: &Path) -> Result<(PathBuf, PathBuf)> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| NetworkError::InvalidInput(format!("{} is not a file path", path.display())))?;
    let tmp = temporary(&dir, &name.to_string_lossy());
    Ok((dir, tmp))
}

/// Reads a whole file, naming it on failure.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| NetworkError::io(path, e))
}
