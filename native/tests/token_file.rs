//! TokenFile: windows from (seed, step) alone, an in-order walk that predicts every token
//! once, and JSONL conversion with its errors.

use rusting_brain::TokenFile;

use rusting_brain_test_support::TempDir as Dir;

#[test]
fn batch_windows_depend_only_on_seed_and_step() {
    let d = Dir::new("tokens_batch");
    let ids: Vec<u32> = (0..10_000).collect();
    TokenFile::write(d.join("c.bin"), &ids).unwrap();
    let mut a = TokenFile::open(d.join("c.bin"), 42).unwrap();
    let mut b = TokenFile::open(d.join("c.bin"), 42).unwrap();
    assert_eq!(a.len(), 10_000);
    // Out of order on one side: the windows of a step do not depend on what came before.
    let b7 = b.batch(7, 4, 64).unwrap();
    let _ = a.batch(3, 4, 64).unwrap();
    assert_eq!(a.batch(7, 4, 64).unwrap(), b7);
    assert_ne!(a.batch(8, 4, 64).unwrap(), b7, "another step, other windows");
    let mut c = TokenFile::open(d.join("c.bin"), 43).unwrap();
    assert_ne!(c.batch(7, 4, 64).unwrap(), b7, "another seed, other windows");
    // Every window is a contiguous run inside the file; targets are inputs shifted by one.
    for step in 0..50 {
        let w = a.batch(step, 3, 100).unwrap();
        for r in 0..3 {
            let row = &w.inputs[r * 100..(r + 1) * 100];
            assert!(row.windows(2).all(|p| p[1] == p[0] + 1));
            assert!(row[0] as usize + 101 <= 10_000);
            assert_eq!(w.targets[r * 100], row[0] + 1);
        }
    }
    assert!(a.batch(0, 1, 10_000).is_err(), "a window longer than the file");
    assert!(a.batch(0, 0, 8).is_err());
}

#[test]
fn chunk_predicts_every_token_once_in_order() {
    let d = Dir::new("tokens_chunk");
    let ids: Vec<u32> = (0..1_003).map(|i| i * 7 % 1000).collect();
    TokenFile::write(d.join("c.bin"), &ids).unwrap();
    let mut f = TokenFile::open(d.join("c.bin"), 0).unwrap();
    let mut predicted = Vec::new();
    let mut i = 0;
    while let Some(b) = f.chunk(i, 4, 50).unwrap() {
        for p in 0..b.inputs.len() {
            if b.mask[p] {
                predicted.push((b.inputs[p], b.targets[p]));
            }
        }
        i += 1;
    }
    assert_eq!(i, 6, "1002 predictions in chunks of 200");
    let want: Vec<(u32, u32)> = ids.windows(2).map(|w| (w[0], w[1])).collect();
    assert_eq!(predicted, want);
    assert!(f.chunk(6, 4, 50).unwrap().is_none());
}

#[test]
fn jsonl_converts_line_by_line_with_errors_naming_the_line() {
    let d = Dir::new("tokens_jsonl");
    std::fs::write(d.join("c.jsonl"), "{\"text\": \"héllo\"}\n\n{\"text\": \"wörld ✓\", \"id\": 2}\n")
        .unwrap();
    let bytes = |s: &str| s.bytes().map(u32::from).collect::<Vec<u32>>();
    let n = TokenFile::write_jsonl(d.join("c.bin"), d.join("c.jsonl"), "text", Some(999), bytes).unwrap();
    let mut want = bytes("héllo");
    want.push(999);
    want.extend(bytes("wörld ✓"));
    want.push(999);
    assert_eq!(n, want.len());
    let raw = std::fs::read(d.join("c.bin")).unwrap();
    let got: Vec<u32> = raw.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got, want);

    std::fs::write(d.join("bad.jsonl"), "{\"text\": \"a\"}\n{\"text\": \"b\"\n{\"text\": \"c\"}\n").unwrap();
    let e = TokenFile::write_jsonl(d.join("bad.bin"), d.join("bad.jsonl"), "text", None, bytes)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.jsonl") && e.contains("line 2") && e.contains("malformed JSON"), "{e}");
    assert!(!d.join("bad.bin").exists(), "a failed conversion writes nothing");
    std::fs::write(d.join("field.jsonl"), "{\"body\": \"a\"}\n").unwrap();
    let e = TokenFile::write_jsonl(d.join("f.bin"), d.join("field.jsonl"), "text", None, bytes)
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1") && e.contains("no string field \"text\""), "{e}");
    // The good file from before is untouched by a failed conversion into the same name.
    assert!(TokenFile::write_jsonl(d.join("c.bin"), d.join("bad.jsonl"), "text", None, bytes).is_err());
    assert_eq!(std::fs::read(d.join("c.bin")).unwrap(), raw);
}

#[test]
fn bad_token_files_are_errors() {
    let d = Dir::new("tokens_bad");
    std::fs::write(d.join("odd.bin"), [1u8, 2, 3, 4, 5]).unwrap();
    assert!(TokenFile::open(d.join("odd.bin"), 0).err().unwrap().to_string().contains("not a whole number"));
    std::fs::write(d.join("one.bin"), 7u32.to_le_bytes()).unwrap();
    assert!(TokenFile::open(d.join("one.bin"), 0).is_err());
    assert!(TokenFile::open(d.join("none.bin"), 0).err().unwrap().to_string().contains("none.bin"));
}
