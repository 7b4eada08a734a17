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
    assert!(data.inputs()[5][3] > 0.85 && data.inputs()[0][3] < 0.15, "right edge follows the class");
    let (rgb, _) = Dataset::from_image_folder(&dir, 4, 4, false).unwrap();
    assert_eq!(rgb.input_size(), 48);
    assert!(rgb.inputs()[0][0] > 0.7 && rgb.inputs()[0][16] < 0.05, "planar R then G: red on the left");

    std::fs::write(dir.join("dark").join("notes.txt"), b"not an image").unwrap();
    let e = Dataset::from_image_folder(&dir, 4, 4, true).unwrap_err().to_string();
    assert!(e.contains("notes.txt"), "{e}");
    std::fs::remove_file(dir.join("dark").join("notes.txt")).unwrap();
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    let e = Dataset::from_image_folder(&dir, 4, 4, true).unwrap_err().to_string();
    assert!(e.contains("empty") && e.contains("no images"), "{e}");
    let e = Dataset::from_image_folder(dir.join("dark"), 4, 4, true).unwrap_err().to_string();
    assert!(e.contains("no class subfolders"), "{e}");
    assert!(Dataset::from_image_folder(&dir, 0, 4, true).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

/// The README's autoencoder round trip: a picture through `load_image`, `encode_image`,
/// `decode_image` and `save_png`, on the tiny SD-style VAE of `tests/fixtures/vae`, and
/// the pixel mapping both ways.
#[test]
fn vae_pictures_round_trip_through_png() {
    use rusting_brain::vae::{self, Image, Vae};
    let dir = rusting_brain_test_support::TempDir::new("vae_png");
    // Every 8-bit level survives [-1, 1] and back.
    let (w, h) = (16usize, 16usize);
    let data: Vec<f32> = (0..3 * w * h).map(|i| ((i * 7) % 256) as f32 / 127.5 - 1.0).collect();
    let picture = Image { width: w, height: h, channels: 3, data };
    vae::save_png(&picture, dir.join("in.png")).unwrap();
    let back = vae::load_image(dir.join("in.png")).unwrap();
    assert_eq!((back.width, back.height, back.channels), (w, h, 3));
    let worst = rusting_brain_test_support::worst_abs_diff(&back.data, &picture.data);
    assert!(worst < 1e-6, "pixel levels moved by {worst}");

    let model = Vae::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/vae/sd/vae")).unwrap();
    let latent = model.encode_image(&back).unwrap();
    assert_eq!((latent.channels, latent.h, latent.w), (4, 8, 8));
    let out = model.decode_image(&latent.mean, latent.h, latent.w).unwrap();
    assert_eq!((out.width, out.height, out.channels), (16, 16, 3));
    assert!(out.data.iter().all(|v| (-1.0..=1.0).contains(v)), "decode_image clamps to [-1, 1]");
    vae::save_png(&out, dir.join("out.png")).unwrap();
    assert_eq!(vae::load_image(dir.join("out.png")).unwrap().width, 16);

    // What cannot be written or read is an error, and the old file stays.
    let grey = Image { channels: 1, data: vec![0.0; w * h], ..picture.clone() };
    let e = vae::save_png(&grey, dir.join("in.png")).unwrap_err().to_string();
    assert!(e.contains("3 channels"), "{e}");
    let mut nan = picture.clone();
    nan.data[5] = f32::NAN;
    let e = vae::save_png(&nan, dir.join("in.png")).unwrap_err().to_string();
    assert!(e.contains("pixel value 5 is NaN"), "{e}");
    assert_eq!(vae::load_image(dir.join("in.png")).unwrap(), back, "a refused save changed the file");
    std::fs::write(dir.join("junk.png"), b"not a png").unwrap();
    let e = vae::load_image(dir.join("junk.png")).unwrap_err().to_string();
    assert!(e.contains("junk.png"), "{e}");
    let e = model.encode_image(&grey).unwrap_err().to_string();
    assert!(e.contains("1 channels; the autoencoder takes 3"), "{e}");
}
