//! An output head of its own (`lm_head.weight`, `tie_embeddings: false`) against the tied
//! model it must reduce to: with the head set equal to the embedding, the logits are the
//! tied model's, and the tied embedding's gradient is the sum of the untied embedding's and
//! head's gradients (the tied weight is used twice; untying splits its two uses).

use rusting_brain_core::models::transformer::{TokenBatch, TransformerConfig, TransformerModel};
use rusting_brain_core::reference::ReferenceBackend;

fn config(tied: bool) -> TransformerConfig {
    TransformerConfig { tie_embeddings: tied, ..TransformerConfig::llama(13, 8, 2, (2, 1, 4), 12, 8) }
}

fn named<'a>(list: &'a [(String, Vec<f32>)], name: &str) -> &'a [f32] {
    &list.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} missing")).1
}

/// Largest |a - b| over max |b|; fails on NaN and on a length mismatch.
fn rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| {
        assert!(x.is_finite() && y.is_finite(), "non-finite value");
        m.max((x - y).abs())
    });
    worst / scale
}

#[test]
fn an_untied_head_equal_to_the_embedding_reduces_to_the_tied_model() {
    let mut tied = TransformerModel::new(ReferenceBackend, config(true), 3).unwrap();
    let mut untied = TransformerModel::new(ReferenceBackend, config(false), 3).unwrap();
    let params = tied.named_parameters().unwrap();
    assert_eq!(untied.named_parameters().unwrap().len(), params.len() + 1);
    for (name, values) in &params {
        untied.set_parameter(name, values).unwrap();
    }
    untied.set_parameter("lm_head.weight", named(&params, "model.embed_tokens.weight")).unwrap();
    let batch = TokenBatch::new(vec![vec![1, 5, 7, 2, 12], vec![0, 3, 3, 9, 4]]).unwrap();
    let a = tied.forward_logits(&batch).unwrap();
    let b = untied.forward_logits(&batch).unwrap();
    assert_eq!(a, b, "the same weights give the same logits");
    // And the head is what makes them: another head, other logits.
    let other: Vec<f32> = named(&params, "model.embed_tokens.weight").iter().map(|v| -v).collect();
    untied.set_parameter("lm_head.weight", &other).unwrap();
    let c = untied.forward_logits(&batch).unwrap();
    assert!(rel(&c, &a) > 0.5);
    untied.set_parameter("lm_head.weight", named(&params, "model.embed_tokens.weight")).unwrap();

    tied.zero_grad().unwrap();
    untied.zero_grad().unwrap();
    let la = tied.accumulate(&batch).unwrap();
    let lb = untied.accumulate(&batch).unwrap();
    assert_eq!(la.sum, lb.sum);
    let ga = tied.named_gradients().unwrap();
    let gb = untied.named_gradients().unwrap();
    let split: Vec<f32> = named(&gb, "model.embed_tokens.weight")
        .iter()
        .zip(named(&gb, "lm_head.weight"))
        .map(|(e, h)| e + h)
        .collect();
    // Both sides sum the same products in another order: f32 rounding only.
    let r = rel(&split, named(&ga, "model.embed_tokens.weight"));
    assert!(r < 1e-6, "embedding + head gradients vs the tied one: {r}");
    // Each use carries a real share: neither gradient is zero or the whole of the tied one.
    for part in ["model.embed_tokens.weight", "lm_head.weight"] {
        let r = rel(named(&gb, part), named(&ga, "model.embed_tokens.weight"));
        assert!(r > 1e-2 && r < 0.99, "{part}: {r}");
    }
    for (name, g) in &ga {
        if name != "model.embed_tokens.weight" {
            assert!(rel(named(&gb, name), g) < 1e-6, "{name}");
        }
    }
}

#[test]
fn an_untied_head_is_its_own_tensor_in_counts_and_names() {
    let c = config(false);
    assert_eq!(c.parameter_count(), config(true).parameter_count() + 13 * 8);
    let names: Vec<String> = c.layout().into_named().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.last().map(String::as_str), Some("lm_head.weight"));
}
