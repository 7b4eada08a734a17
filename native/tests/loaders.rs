//! Every loader on good and bad files: each bad file is an error naming the file and the
//! line, field or header entry; none panics and none allocates from a lying header.

use std::path::PathBuf;

use rusting_brain::{Dataset, NetworkError};

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("rb_loaders_{tag}_{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn file(&self, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

#[track_caller]
fn err_contains(r: Result<impl std::fmt::Debug, NetworkError>, parts: &[&str]) {
    let e = r.expect_err("expected an error").to_string();
    for p in parts {
        assert!(e.contains(p), "error `{e}` should mention `{p}`");
    }
}

#[test]
fn csv_with_header_quotes_crlf_and_trailing_blank_lines() {
    let d = Dir::new("csv_ok");
    let p = d.file("a.csv", "x1,\"x,2\",y\r\n1,2,3\r\n\"4\", 5 ,6\r\n\r\n\n");
    let data = Dataset::from_csv(&p, 1).unwrap();
    assert_eq!(data.inputs(), &[vec![1.0, 2.0], vec![4.0, 5.0]]);
    assert_eq!(data.targets(), &[vec![3.0], vec![6.0]]);
    // No header: the first row is data.
    let p = d.file("b.csv", "1,2,3,4\n5,6,7,8\n");
    let data = Dataset::from_csv(&p, 2).unwrap();
    assert_eq!((data.len(), data.input_size(), data.target_size()), (2, 2, 2));
}

#[test]
fn csv_errors_name_the_file_line_and_column() {
    let d = Dir::new("csv_bad");
    let ragged = d.file("ragged.csv", "a,b,c\n1,2,3\n4,5\n");
    err_contains(Dataset::from_csv(&ragged, 1), &["ragged.csv", "line 3", "2 fields"]);
    let text = d.file("text.csv", "a,b\n1,2\n3,oops\n");
    err_contains(Dataset::from_csv(&text, 1), &["text.csv", "line 3, column 2", "`oops`"]);
    // A typo in the first row of a file without a header is an error, not a header.
    let typo = d.file("typo.csv", "1,x2,3\n4,5,6\n");
    err_contains(Dataset::from_csv(&typo, 1), &["typo.csv", "line 1, column 2", "`x2`"]);
    let typo = d.file("typo_labeled.csv", "5.1,3.5,l.4,setosa\n4.9,3.0,1.4,setosa\n");
    err_contains(Dataset::from_csv_labeled(&typo), &["typo_labeled.csv", "line 1, column 3", "`l.4`"]);
    let empty = d.file("empty.csv", "");
    err_contains(Dataset::from_csv(&empty, 1), &["empty.csv", "no data rows"]);
    let header_only = d.file("header.csv", "a,b,c\n");
    err_contains(Dataset::from_csv(&header_only, 1), &["no data rows"]);
    let two = d.file("two.csv", "1,2\n");
    err_contains(Dataset::from_csv(&two, 2), &["2 target columns", "2 columns"]);
    err_contains(Dataset::from_csv(&two, 0), &["0 target columns"]);
    let quote = d.file("quote.csv", "1,\"2\n3,4\n");
    err_contains(Dataset::from_csv(&quote, 1), &["quote.csv", "never closed"]);
    let nan = d.file("nan.csv", "1,2\nNaN,3\n");
    err_contains(Dataset::from_csv(&nan, 1), &["line 2, column 1", "finite"]);
    let binary = d.file("binary.csv", [0xff, 0xfe, b'1', b',', b'2']);
    err_contains(Dataset::from_csv(&binary, 1), &["binary.csv", "UTF-8"]);
    err_contains(Dataset::from_csv(d.0.join("missing.csv"), 1), &["missing.csv"]);
}

#[test]
fn labeled_csv_gives_one_hot_targets_and_sorted_class_names() {
    let d = Dir::new("labeled");
    let p = d.file("iris.csv", "a,b,species\n1,2,setosa\n3,4,virginica\n5,6, setosa\n");
    let (data, classes) = Dataset::from_csv_labeled(&p).unwrap();
    assert_eq!(classes, vec!["setosa", "virginica"]);
    assert_eq!(data.targets(), &[vec![1.0, 0.0], vec![0.0, 1.0], vec![1.0, 0.0]]);
    let bad = d.file("bad.csv", "1,2,setosa\n1,x,setosa\n");
    err_contains(Dataset::from_csv_labeled(&bad), &["line 2, column 2"]);
    let empty_label = d.file("empty_label.csv", "1,2,setosa\n1,2,\n");
    err_contains(Dataset::from_csv_labeled(&empty_label), &["line 2", "label is empty"]);
}

/// A .npy file as numpy.save writes it (format 1.0, header padded to 64 bytes).
fn npy(descr: &str, fortran: bool, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn npy_reads_every_supported_dtype_and_rejects_the_rest() {
    let d = Dir::new("npy");
    let f4: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let x = d.file("x.npy", npy("<f4", false, "(3, 2)", &f4));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("<f8", [0.0f64, 1.0, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect()),
        ("<i4", [0i32, 1, 2].iter().flat_map(|v| v.to_le_bytes()).collect()),
        ("<i8", [0i64, 1, 2].iter().flat_map(|v| v.to_le_bytes()).collect()),
        ("|u1", vec![0u8, 1, 2]),
    ];
    for (descr, bytes) in cases {
        let y = d.file("y.npy", npy(descr, false, "(3,)", &bytes));
        let data = Dataset::from_npy(&x, &y).unwrap();
        assert_eq!(data.inputs(), &[vec![1.0, 2.0], vec![3.0, 4.0], vec![5.0, 6.0]], "{descr}");
        assert_eq!(data.targets(), &[vec![0.0], vec![1.0], vec![2.0]], "{descr}");
        let mut data = data;
        data.one_hot_targets(3).unwrap();
        assert_eq!(data.targets()[2], vec![0.0, 0.0, 1.0]);
    }
    let y = d.file("y.npy", npy("|u1", false, "(3,)", &[0, 1, 2]));
    let lying = d.file("lying.npy", npy("<f4", false, "(30000000, 2)", &f4));
    err_contains(Dataset::from_npy(&lying, &y), &["lying.npy", "needs 240000000 bytes", "holds 24"]);
    let fortran = d.file("fortran.npy", npy("<f4", true, "(3, 2)", &f4));
    err_contains(Dataset::from_npy(&fortran, &y), &["fortran.npy", "Fortran"]);
    let complex = d.file("complex.npy", npy("<c8", false, "(3,)", &f4));
    err_contains(Dataset::from_npy(&complex, &y), &["complex.npy", "'<c8' is not supported"]);
    let big_endian = d.file("be.npy", npy(">f4", false, "(3, 2)", &f4));
    err_contains(Dataset::from_npy(&big_endian, &y), &["'>f4' is not supported"]);
    let cube = d.file("cube.npy", npy("<f4", false, "(1, 3, 2)", &f4));
    err_contains(Dataset::from_npy(&cube, &y), &["not 1-D or 2-D"]);
    let not_npy = d.file("text.npy", "hello, world");
    err_contains(Dataset::from_npy(&not_npy, &y), &["text.npy", "not a .npy file"]);
    let mut truncated = npy("<f4", false, "(3, 2)", &f4);
    truncated.truncate(30);
    let truncated = d.file("truncated.npy", truncated);
    err_contains(Dataset::from_npy(&truncated, &y), &["truncated.npy", "header"]);
    let y2 = d.file("y2.npy", npy("|u1", false, "(2,)", &[0, 1]));
    err_contains(Dataset::from_npy(&x, &y2), &["3 rows", "has 2"]);
}

fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[test]
fn idx_reads_images_and_labels_and_rejects_bad_files() {
    let d = Dir::new("idx");
    let images = d.file("img", idx(&[2, 2, 3], &[0, 255, 51, 0, 0, 0, 255, 255, 255, 255, 255, 255]));
    let labels = d.file("lab", idx(&[2], &[7, 3]));
    let mut data = Dataset::from_idx(&images, &labels).unwrap();
    assert_eq!(data.inputs()[0], vec![0.0, 1.0, 0.2, 0.0, 0.0, 0.0]);
    assert_eq!(data.targets(), &[vec![7.0], vec![3.0]]);
    data.one_hot_targets(10).unwrap();
    assert_eq!(data.targets()[1][3], 1.0);
    let mut again = Dataset::from_idx(&images, &labels).unwrap();
    err_contains(again.one_hot_targets(5), &["row 0 holds 7", "below 5"]);

    let magic = d.file("magic", b"\x1f\x8b\x08\x00gzip");
    err_contains(Dataset::from_idx(&magic, &labels), &["magic", "gunzip"]);
    let three = d.file("three", idx(&[3], &[1, 2, 3]));
    err_contains(Dataset::from_idx(&images, &three), &["2 images", "3 labels"]);
    let short = d.file("short", idx(&[2, 2, 3], &[0; 5]));
    err_contains(Dataset::from_idx(&short, &labels), &["short", "holds 5"]);
    let huge = d.file("huge", idx(&[u32::MAX, u32::MAX, u32::MAX], &[]));
    err_contains(Dataset::from_idx(&huge, &labels), &["huge"]);
    err_contains(Dataset::from_idx(&labels, &labels), &["1 dimensions, expected 3"]);
}

#[test]
fn dataset_construction_splits_standardize_and_flips() {
    err_contains(
        Dataset::new(vec![vec![1.0], vec![1.0, 2.0]], vec![vec![0.0], vec![1.0]]),
        &["input row 1 has 2 values"],
    );
    err_contains(Dataset::new(vec![vec![1.0]], vec![]), &["1 input rows but 0 target rows"]);
    let rows: Vec<Vec<f32>> = (0..100).map(|i| vec![i as f32, 5.0]).collect();
    let targets: Vec<Vec<f32>> =
        (0..100).map(|i| if i < 90 { vec![1.0, 0.0] } else { vec![0.0, 1.0] }).collect();
    let data = Dataset::new(rows, targets).unwrap();
    let (a, b) = data.split(0.8);
    assert_eq!((a.len(), b.len()), (80, 20));
    assert_eq!(data.split(0.8), data.split(0.8), "a split is the same every time");
    let (a, b) = data.split_stratified(0.8);
    let rare = |d: &Dataset| d.targets().iter().filter(|t| t[1] == 1.0).count();
    assert_eq!((rare(&a), rare(&b)), (8, 2), "the rare class keeps its share on both sides");
    let (all, none) = data.split(f32::NAN);
    assert_eq!((all.len(), none.len()), (0, 100));
    let mut train = a.clone();
    let stats = train.standardize();
    let mean: f32 = train.inputs().iter().map(|r| r[0]).sum::<f32>() / train.len() as f32;
    assert!(mean.abs() < 1e-5);
    assert!(train.inputs().iter().all(|r| r[1] == 0.0), "a constant column is only centered");
    let mut test = b.clone();
    stats.apply(&mut test).unwrap();
    let mut row = vec![45.0, 5.0];
    stats.apply_row(&mut row).unwrap();
    err_contains(stats.apply_row(&mut [1.0]), &["2 input columns", "row has 1"]);
    let mut img = Dataset::new(vec![vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], vec![vec![1.0]]).unwrap();
    img.flip_horizontal(3).unwrap();
    assert_eq!(img.inputs()[1], vec![3.0, 2.0, 1.0, 6.0, 5.0, 4.0]);
    assert_eq!(img.targets()[1], vec![1.0]);
    err_contains(img.flip_horizontal(4), &["not a whole number of 4-pixel lines"]);
}
