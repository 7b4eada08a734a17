//! Files whose headers lie about their sizes: every loader refuses them with an error
//! before allocating what the header claims. A counting allocator records the largest
//! single allocation while each small file is read; it must stay far below the size the
//! header asks for (the files here are a few KiB; the lies ask for tens of GiB).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rusting_brain::{Dataset, Network, Precision, TokenFile, TransformerLm};
use rusting_brain_test_support::TempDir;

struct Counting;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counter only
// observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One measurement at a time (the counter is global).
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `load`, which must fail, and returns its error text; panics if any single
/// allocation during it passed 64 MiB.
fn refused<T>(what: &str, load: impl FnOnce() -> rusting_brain::Result<T>) -> String {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    LARGEST.store(0, Ordering::Relaxed);
    let result = load();
    let largest = LARGEST.load(Ordering::Relaxed);
    let err = match result {
        Ok(_) => panic!("{what}: a lying file loaded"),
        Err(e) => e.to_string(),
    };
    assert!(largest < 64 << 20, "{what}: allocated {largest} bytes at once for a file of a few KiB ({err})");
    eprintln!("{what}: refused, largest allocation {largest} bytes: {err}");
    err
}

/// A safetensors file: the JSON header as given, then `data` bytes.
fn safetensors(header: &str, data: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(std::iter::repeat_n(0u8, data));
    out
}

#[test]
fn headers_that_lie_about_sizes_are_refused_before_allocating() {
    let d = TempDir::new("lying");

    // A Hugging Face config of a 30-billion-wide model over a tiny weights file.
    let hf = d.join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    let config = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/hf/llama/config.json"
    ))
    .unwrap()
    .replace("\"hidden_size\": 32", "\"hidden_size\": 3000000000")
    .replace("\"vocab_size\": 64", "\"vocab_size\": 4000000000");
    std::fs::write(hf.join("config.json"), config).unwrap();
    std::fs::write(
        hf.join("model.safetensors"),
        safetensors(
            r#"{"model.embed_tokens.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#,
            16,
        ),
    )
    .unwrap();
    for p in [Precision::F32, Precision::Q8] {
        refused(&format!("config.json of a huge model ({p:?})"), || {
            TransformerLm::from_pretrained_at(&hf, p)
        });
    }
    // The weights file's header claims a tensor of 2^40 elements the file does not hold.
    std::fs::write(
        hf.join("config.json"),
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/hf/llama/config.json"))
            .unwrap(),
    )
    .unwrap();
    std::fs::write(
        hf.join("model.safetensors"),
        safetensors(
            r#"{"model.embed_tokens.weight":{"dtype":"F32","shape":[1099511627776,1],"data_offsets":[0,4398046511104]}}"#,
            64,
        ),
    )
    .unwrap();
    refused("safetensors header with a 4 TiB tensor", || TransformerLm::from_pretrained(&hf));

    // A real .rbw whose configuration is edited to claim a huge model.
    let rbw = d.join("big.rbw");
    rusting_brain_test_support::rule_model(32, 16).build().unwrap().save_bin(&rbw, Precision::F32).unwrap();
    let bytes = std::fs::read(&rbw).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let config = header["__metadata__"]["config"].as_str().unwrap().to_string();
    let mut c: serde_json::Value = serde_json::from_str(&config).unwrap();
    c["d_model"] = 3_000_000_000u64.into();
    c["vocab_size"] = 4_000_000_000u64.into();
    header["__metadata__"]["config"] = c.to_string().into();
    let text = header.to_string();
    let mut lying = (text.len() as u64).to_le_bytes().to_vec();
    lying.extend_from_slice(text.as_bytes());
    lying.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&rbw, lying).unwrap();
    let err = refused(".rbw configuration of a huge model", || TransformerLm::load_bin(&rbw));
    assert!(!err.contains("format"), "refused for its format, not its sizes: {err}");

    // A .npy header whose shape needs 2^60 floats.
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1152921504606846976, 1), }\n";
    npy.extend_from_slice(&(header.len() as u16).to_le_bytes());
    npy.extend_from_slice(header.as_bytes());
    npy.extend_from_slice(&[0u8; 64]);
    std::fs::write(d.join("x.npy"), &npy).unwrap();
    refused(".npy shape of 2^60 rows", || Dataset::from_npy(d.join("x.npy"), d.join("x.npy")));

    // IDX sizes of 2^32 - 1 images of 2^32 - 1 pixels.
    let mut idx = vec![0u8, 0, 8, 3];
    for _ in 0..3 {
        idx.extend_from_slice(&u32::MAX.to_be_bytes());
    }
    std::fs::write(d.join("images.idx"), &idx).unwrap();
    std::fs::write(d.join("labels.idx"), [0u8, 0, 8, 1, 255, 255, 255, 255]).unwrap();
    refused("IDX sizes of 2^96 bytes", || Dataset::from_idx(d.join("images.idx"), d.join("labels.idx")));

    // A real dense network's JSON edited to claim billions of inputs and units.
    let net = Network::builder()
        .input_size(3)
        .dense(2, rusting_brain::Activation::Relu)
        .loss(rusting_brain::Loss::MeanSquaredError)
        .build();
    net.save_json(d.join("net.json")).unwrap();
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("net.json")).unwrap()).unwrap();
    v["input_size"] = 3_000_000_000u64.into();
    v["layers"][0]["units"] = 3_000_000_000u64.into();
    std::fs::write(d.join("net.json"), v.to_string()).unwrap();
    let err = refused("network JSON of 9e18 weights", || Network::load_json(d.join("net.json")));
    assert!(!err.contains("unknown field"), "refused for a field name, not its sizes: {err}");

    // A token file of one id is too short to train on; the check needs no allocation.
    std::fs::write(d.join("one.tok"), 7u32.to_le_bytes()).unwrap();
    refused("a token file of one id", || TokenFile::open(d.join("one.tok"), 0));
}
