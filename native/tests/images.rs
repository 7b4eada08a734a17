//! Image folders (`--features images`): decoding, resizing, layout and bad folders.
#![cfg(feature = "images")]

use rusting_brain::Dataset;

#[test]
fn image_folders_load_resized_rows_with_class_names() {
    let dir = std::env::temp_dir().join(format!("rb_images_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (class, value) in [("dark", 20u8), ("light", 230u8)] {
        std::fs::create_dir_all(dir.join(class)).unwrap();
        for i in 0..3 {
            // Left half red-ish, right half at `value`: a flip is visible.
            let img = image::RgbImage::from_fn(8, 6, |x, _| {
                if x < 4 {
                    image::Rgb([200, 0, 0])
                } else {
                    image::Rgb([value; 3])
                }
            });
            img.save(dir.join(class).join(format!("{i}.png"))).unwrap();
        }
    }
    std::fs::write(dir.join("light").join(".DS_Store"), b"junk").unwrap();
    let (data, classes) = Dataset::from_image_folder(&dir, 4, 4, true).unwrap();
    assert_eq!(classes, vec!["dark", "light"]);
    assert_eq!((data.len(), data.input_size(), data.target_size()), (6, 16, 2));
    assert_eq!(data.targets()[0], vec![1.0, 0.0]);
    assert_eq!(data.targets()[5], vec![0.0, 1.0]);
    assert!(
        data.inputs()[5][3] > 0.85 && data.inputs()[0][3] < 0.15,
        "right edge follows the class"
    );
    let (rgb, _) = Dataset::from_image_folder(&dir, 4, 4, false).unwrap();
    assert_eq!(rgb.input_size(), 48);
    assert!(
        rgb.inputs()[0][0] > 0.7 && rgb.inputs()[0][16] < 0.05,
        "planar R then G: red on the left"
    );

    std::fs::write(dir.join("dark").join("notes.txt"), b"not an image").unwrap();
    let e = Dataset::from_image_folder(&dir, 4, 4, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("notes.txt"), "{e}");
    std::fs::remove_file(dir.join("dark").join("notes.txt")).unwrap();
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    let e = Dataset::from_image_folder(&dir, 4, 4, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty") && e.contains("no images"), "{e}");
    let e = Dataset::from_image_folder(dir.join("dark"), 4, 4, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no class subfolders"), "{e}");
    assert!(Dataset::from_image_folder(&dir, 0, 4, true).is_err());
    std::fs::remove_dir_all(&dir).ok();
}
