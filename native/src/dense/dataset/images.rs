//! Image folders: `dir/<class>/<image>`, decoded with the `image` crate (PNG, JPEG, BMP),
//! resized with a triangle filter, flattened to rows in 0.0..=1.0.

use std::path::{Path, PathBuf};

use super::Dataset;
use crate::{NetworkError, Result};

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| NetworkError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        // Hidden files (.DS_Store, editor swap files) are not data.
        .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    entries.sort();
    Ok(entries)
}

pub fn read_folder(dir: &Path, width: u32, height: u32, grayscale: bool) -> Result<(Dataset, Vec<String>)> {
    if width == 0 || height == 0 {
        return Err(NetworkError::InvalidInput(format!(
            "image size {width}x{height}: both sides must be at least 1"
        )));
    }
    let classes: Vec<PathBuf> = sorted_entries(dir)?.into_iter().filter(|p| p.is_dir()).collect();
    if classes.is_empty() {
        return Err(NetworkError::parse(
            dir,
            "folder",
            "no class subfolders (expected dir/<class>/<image files>)",
        ));
    }
    let names: Vec<String> = classes
        .iter()
        .map(|p| p.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned()))
        .collect();
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for (c, class_dir) in classes.iter().enumerate() {
        let files: Vec<PathBuf> = sorted_entries(class_dir)?.into_iter().filter(|p| p.is_file()).collect();
        if files.is_empty() {
            return Err(NetworkError::parse(class_dir, "folder", "this class folder holds no images"));
        }
        for file in files {
            let img = image::open(&file).map_err(|e| NetworkError::parse(&file, "image", e.to_string()))?;
            let img = img.resize_exact(width, height, image::imageops::FilterType::Triangle);
            let row: Vec<f32> = if grayscale {
                img.to_luma8().pixels().map(|p| p.0[0] as f32 / 255.0).collect()
            } else {
                let rgb = img.to_rgb8();
                let plane = (width * height) as usize;
                let mut row = vec![0.0f32; 3 * plane];
                for (i, p) in rgb.pixels().enumerate() {
                    for ch in 0..3 {
                        row[ch * plane + i] = p.0[ch] as f32 / 255.0;
                    }
                }
                row
            };
            let mut t = vec![0.0; names.len()];
            t[c] = 1.0;
            inputs.push(row);
            targets.push(t);
        }
    }
    Ok((Dataset::new(inputs, targets)?, names))
}
