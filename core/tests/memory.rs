//! Sizes no memory holds are errors, never aborts or overflows: a language model's context
//! comes from a file's metadata (`max_position_embeddings`, a GGUF `context_length`).

use rusting_brain_core::backend::Memory;
use rusting_brain_core::models::transformer::{TransformerConfig, TransformerModel};
use rusting_brain_core::reference::ReferenceBackend;

/// A buffer beyond any 64-bit address space (2^46 floats, 256 TiB) is an error from the
/// host backends' `zeros`, where a plain allocation would abort the process.
#[test]
fn a_buffer_no_memory_holds_is_an_error() {
    let e = ReferenceBackend.zeros(1 << 46).expect_err("2^46 floats are refused");
    assert!(e.to_string().contains("cannot allocate"), "{e}");
    assert_eq!(ReferenceBackend.zeros(3).unwrap(), vec![0.0; 3]);
}

/// A context whose KV cache cannot even be counted is refused by the configuration; one
/// that can be counted but not held loads, and its KV cache is the error.
#[test]
fn a_context_no_memory_holds_is_an_error() {
    let config = |max_seq_len| TransformerConfig::llama(13, 8, 1, (2, 1, 4), 12, max_seq_len);
    let e = config(usize::MAX / 2).validate().unwrap_err();
    assert!(e.to_string().contains("do not fit in memory"), "{e}");
    let model = TransformerModel::new(ReferenceBackend, config(1 << 44), 1).unwrap();
    let e = model.new_kv_caches().err().expect("a 2^46-float KV cache is refused");
    assert!(e.to_string().contains("cannot allocate"), "{e}");
}
