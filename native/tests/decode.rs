//! KV-cached decoding against the full forward pass, the Decoder across turns, generate,
//! and the cache's errors.

use rusting_brain::core::Rng;
use rusting_brain::{LoraConfig, Optimizer, Sampler, TokenBatch, TransformerLm};

use rusting_brain_test_support::{nan_max, TempDir};

fn model(max_seq: usize, seed: u64) -> TransformerLm {
    let mut m = TransformerLm::builder()
        .shape(48, 32, 2, (4, 2, 8), 64, max_seq)
        .optimizer(Optimizer::adam(1e-2))
        .seed(seed)
        .build()
        .unwrap();
    // A few steps so the weights are not just the initialization.
    let mut rng = Rng::new(seed);
    for _ in 0..5 {
        let n = 17.min(max_seq + 1);
        let seqs: Vec<Vec<u32>> = (0..2).map(|_| (0..n).map(|_| rng.below(48) as u32).collect()).collect();
        m.train_step(&seqs).unwrap();
    }
    m
}

/// Row `t` of the full forward's logits over `seq` (inputs `seq[..n-1]`).
fn full_logits(m: &mut TransformerLm, seq: &[u32]) -> Vec<Vec<f32>> {
    let mut padded = seq.to_vec();
    padded.push(0); // the target of the last position is not used
    let logits = m.forward_batch(&TokenBatch::new(&[padded]).unwrap()).unwrap();
    logits.chunks(48).map(<[f32]>::to_vec).collect()
}

#[track_caller]
fn same(what: &str, a: &[f32], b: &[f32]) {
    let scale = b.iter().map(|v| v.abs()).fold(0.0f32, nan_max).max(1e-6);
    let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, nan_max);
    // 1e-5 of the row's scale: the two paths sum in different orders (the full pass uses
    // the blocked attention, decoding the per-row one), nothing more.
    assert!(diff <= 1e-5 * scale, "{what}: cached and full logits differ by {diff} (scale {scale})");
}

#[test]
fn kv_cache_decode_matches_full_forward_at_every_step() {
    let mut m = model(40, 1);
    let mut rng = Rng::new(2);
    let seq: Vec<u32> = (0..30).map(|_| rng.below(48) as u32).collect();
    let full = full_logits(&mut m, &seq);
    let mut caches = m.new_kv_caches();
    let first = m.forward_cached(&seq[..5], &mut caches).unwrap();
    same("prefill of 5", &first, &full[4]);
    for t in 5..seq.len() {
        let l = m.forward_cached(&seq[t..t + 1], &mut caches).unwrap();
        same(&format!("decode at {t}"), &l, &full[t]);
    }
    assert_eq!(caches.len(), 30);
    // A prefill of 20 (the blocked attention path) after 5 cached positions.
    let mut c2 = m.new_kv_caches();
    m.forward_cached(&seq[..5], &mut c2).unwrap();
    let l = m.forward_cached(&seq[5..25], &mut c2).unwrap();
    same("prefill of 20 after 5", &l, &full[24]);
}

#[test]
fn the_decoder_keeps_its_caches_across_turns() {
    let mut m = model(64, 3);
    let mut greedy = Sampler::greedy();
    let context = {
        let mut d = m.decoder();
        d.feed(&[1, 2, 3, 4]).unwrap();
        for _ in 0..3 {
            d.next(&mut greedy).unwrap();
        }
        d.feed(&[7, 8]).unwrap();
        d.next(&mut greedy).unwrap();
        d.feed(&[9]).unwrap();
        (d.context().to_vec(), d.logits().unwrap().unwrap().to_vec())
    };
    assert_eq!(context.0.len(), 4 + 3 + 2 + 1 + 1);
    let full = full_logits(&mut m, &context.0);
    same("after three turns", &context.1, full.last().unwrap());
}

#[test]
fn generate_is_greedy_argmax_and_streams_until_told_to_stop() {
    let mut m = model(64, 4);
    let prompt = [5u32, 6, 7];
    let ids = m.generate(&prompt, 10, &mut Sampler::greedy()).unwrap();
    assert_eq!(ids.len(), 10);
    // The same by hand: argmax of the full forward, one token at a time.
    let mut ctx = prompt.to_vec();
    for &id in &ids {
        let row = full_logits(&mut m, &ctx).pop().unwrap();
        let best = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32;
        assert_eq!(id, best);
        ctx.push(id);
    }
    let mut seen = Vec::new();
    let stopped = m
        .generate_with(&prompt, 10, &mut Sampler::temperature(0.9, Some(7)).top_k(10), |id| {
            seen.push(id);
            seen.len() < 4
        })
        .unwrap();
    assert_eq!(stopped, seen);
    assert_eq!(stopped.len(), 4);
    let again = m.generate(&prompt, 4, &mut Sampler::temperature(0.9, Some(7)).top_k(10)).unwrap();
    assert_eq!(again, stopped, "a seed gives the same continuation");
    // The cache fills at max_seq_len: generation stops there instead of failing.
    let mut small = model(8, 5);
    assert_eq!(small.generate(&[1, 2, 3], 100, &mut Sampler::greedy()).unwrap().len(), 6);
}

#[test]
fn cache_errors_are_reported() {
    let mut m = model(8, 6);
    let mut c = m.new_kv_caches();
    let e = m.forward_cached(&[1, 2, 99], &mut c).unwrap_err().to_string();
    assert!(e.contains("token id 99 at batch row 0, position 2"), "{e}");
    assert!(m.forward_cached(&[], &mut c).is_err());
    m.forward_cached(&[1, 2, 3, 4, 5, 6], &mut c).unwrap();
    let e = m.forward_cached(&[1, 2, 3], &mut c).unwrap_err().to_string();
    assert!(e.contains("6 cached + 3 new positions is over max_seq_len 8"), "{e}");
    let mut other = model(16, 7);
    let e = other.forward_cached(&[1], &mut c).unwrap_err().to_string();
    assert!(e.contains("another shape"), "{e}");
}

/// Three sequences (prompts of 3, 7 and 12 tokens) stepped together by
/// `forward_cached_rows`, one leaving after two steps, against each stepped alone by
/// `forward_cached` on caches of its own: every row gets the bits of its sequence alone
/// whatever shares its step, int8 and f32 (a few rows' products sum each row as one row's
/// do).
#[test]
fn a_step_over_several_sequences_gives_each_its_own_logits() {
    for q8 in [false, true] {
        let mut m = model(40, 8);
        if q8 {
            m.quantize().unwrap();
        }
        let mut rng = Rng::new(9);
        let seqs: Vec<Vec<u32>> =
            [3, 7, 12].iter().map(|&n| (0..n).map(|_| rng.below(48) as u32).collect()).collect();
        let (mut together, mut alone): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
        for s in &seqs {
            let (mut a, mut b) = (m.new_kv_caches(), m.new_kv_caches());
            m.forward_cached(s, &mut a).unwrap();
            m.forward_cached(s, &mut b).unwrap();
            together.push(a);
            alone.push(b);
        }
        for step in 0..4 {
            // The last sequence leaves after two steps: the batch goes from three rows to two.
            let live = if step < 2 { 3 } else { 2 };
            let ids: Vec<u32> = (0..live).map(|i| ((step * 7 + i * 5) % 48) as u32).collect();
            let mut rows: Vec<&mut _> = together.iter_mut().take(live).collect();
            let logits = m.forward_cached_rows(&ids, &mut rows).unwrap();
            assert_eq!(logits.len(), live * 48);
            for (i, row) in logits.chunks(48).enumerate() {
                let want = m.forward_cached(&ids[i..i + 1], &mut alone[i]).unwrap();
                let what = format!("q8 {q8}, step {step}, sequence {i}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(row), bits(&want), "{what}: not the bits of the sequence alone");
            }
        }
        let lens: Vec<usize> = together.iter().map(|c| c.len()).collect();
        assert_eq!(lens, vec![7, 11, 14]);
    }
}

#[test]
fn a_step_over_several_sequences_refuses_bad_input_and_changes_nothing() {
    let mut m = model(8, 10);
    let (mut a, mut b) = (m.new_kv_caches(), m.new_kv_caches());
    m.forward_cached(&[1, 2], &mut a).unwrap();
    m.forward_cached(&[1, 2, 3, 4, 5, 6, 7, 8], &mut b).unwrap();
    let e = m.forward_cached_rows(&[1], &mut [&mut a, &mut b]).unwrap_err().to_string();
    assert!(e.contains("1 ids for 2 KV caches"), "{e}");
    let e = m.forward_cached_rows(&[1, 99], &mut [&mut a, &mut b]).unwrap_err().to_string();
    assert!(e.contains("token id 99"), "{e}");
    // b is full: nothing is appended to a either.
    let e = m.forward_cached_rows(&[1, 2], &mut [&mut a, &mut b]).unwrap_err().to_string();
    assert!(e.contains("8 cached + 1 new positions is over max_seq_len 8"), "{e}");
    assert!(m.forward_cached_rows(&[], &mut []).is_err());
    assert_eq!((a.len(), b.len()), (2, 8));
    let mut other = model(16, 11);
    let e = other.forward_cached_rows(&[1], &mut [&mut a]).unwrap_err().to_string();
    assert!(e.contains("another shape"), "{e}");
}

/// Two adapters of their own ranks and targets, trained a few steps, loaded by name
/// beside an f32 and an int8 base; four sequences picking one, the other or the base
/// stepped together by `forward_cached_rows_with` against each stepped alone: every row
/// gets the bits of its sequence alone whatever the others pick, int8 and f32 (an
/// adapter's products run on its row alone). A picked adapter is the model with that
/// adapter attached, bit for bit, and moves the logits well away from the base's.
#[test]
fn sequences_picking_different_adapters_share_a_step() {
    let dir = TempDir::new("named_lora");
    let adapters = [
        ("wide", LoraConfig::new(4).alpha(8.0)),
        ("narrow", LoraConfig::new(2).alpha(4.0).targets(&["q_proj", "v_proj", "down_proj"])),
    ];
    let mut rng = Rng::new(13);
    for (name, config) in &adapters {
        let mut t = model(40, 12);
        t.add_lora(config.clone()).unwrap();
        for _ in 0..5 {
            let seqs: Vec<Vec<u32>> =
                (0..2).map(|_| (0..17).map(|_| rng.below(48) as u32).collect()).collect();
            t.train_step(&seqs).unwrap();
        }
        t.save_lora(dir.join(format!("{name}.rbl"))).unwrap();
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for q8 in [false, true] {
        let build = || {
            let mut m = model(40, 12);
            if q8 {
                m.quantize().unwrap();
            }
            m
        };
        let mut m = build();
        for (name, _) in &adapters {
            m.load_named_lora(name, dir.join(format!("{name}.rbl"))).unwrap();
        }
        assert_eq!(m.named_loras(), ["wide", "narrow"]);
        let prompt = [5u32, 9, 2, 7];
        let base_logits = m.forward_cached_with(&prompt, &mut m.new_kv_caches(), None).unwrap();
        for (name, _) in &adapters {
            let picked = m.forward_cached_with(&prompt, &mut m.new_kv_caches(), Some(name)).unwrap();
            let mut attached = build();
            attached.load_lora(dir.join(format!("{name}.rbl"))).unwrap();
            let want = attached.forward_cached(&prompt, &mut attached.new_kv_caches()).unwrap();
            assert_eq!(bits(&picked), bits(&want), "q8 {q8}: `{name}` picked is not `{name}` attached");
            let moved = picked.iter().zip(&base_logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, nan_max);
            assert!(moved > 1e-2, "q8 {q8}: `{name}` moves the logits by {moved} only");
        }
        let picks = [Some("wide"), None, Some("narrow"), Some("wide")];
        let seqs: Vec<Vec<u32>> =
            [3, 5, 8, 2].iter().map(|&n| (0..n).map(|_| rng.below(48) as u32).collect()).collect();
        let (mut together, mut alone): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
        for (s, pick) in seqs.iter().zip(picks) {
            let (mut a, mut b) = (m.new_kv_caches(), m.new_kv_caches());
            m.forward_cached_with(s, &mut a, pick).unwrap();
            m.forward_cached_with(s, &mut b, pick).unwrap();
            together.push(a);
            alone.push(b);
        }
        for step in 0..3 {
            let ids: Vec<u32> = (0..4).map(|i| ((step * 11 + i * 7) % 48) as u32).collect();
            let mut rows: Vec<&mut _> = together.iter_mut().collect();
            let logits = m.forward_cached_rows_with(&ids, &mut rows, &picks).unwrap();
            for (i, row) in logits.chunks(48).enumerate() {
                let want = m
                    .forward_cached_rows_with(&ids[i..i + 1], &mut [&mut alone[i]], &picks[i..i + 1])
                    .unwrap();
                let what = format!("q8 {q8}, step {step}, sequence {i} ({:?})", picks[i]);
                assert_eq!(bits(row), bits(&want), "{what}: not the bits of the sequence alone");
            }
        }
    }
}

#[test]
fn named_adapters_refuse_bad_names_and_files_and_change_nothing() {
    let dir = TempDir::new("named_lora_bad");
    let mut t = model(16, 14);
    t.add_lora(LoraConfig::new(2)).unwrap();
    let path = dir.join("a.rbl");
    t.save_lora(&path).unwrap();
    let mut m = model(16, 14);
    m.load_named_lora("a", &path).unwrap();
    let e = m.load_named_lora("a", &path).unwrap_err().to_string();
    assert!(e.contains("already loaded"), "{e}");
    let e = m.load_named_lora("", &path).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");
    let e = m.load_named_lora("b", dir.join("missing.rbl")).unwrap_err().to_string();
    assert!(e.contains("missing.rbl"), "{e}");
    let mut c = m.new_kv_caches();
    let e = m.forward_cached_with(&[1], &mut c, Some("zz")).unwrap_err().to_string();
    assert!(e.contains("no adapters are loaded under `zz`; loaded: [a]"), "{e}");
    let e = m.forward_cached_rows_with(&[1, 2], &mut [&mut c], &[None]).unwrap_err().to_string();
    assert!(e.contains("2 ids for 1 KV caches"), "{e}");
    assert_eq!((c.len(), m.named_loras()), (0, vec!["a".to_string()]));
    // Attached and named adapters do not mix.
    let e = t.load_named_lora("b", &path).unwrap_err().to_string();
    assert!(e.contains("adapters attached"), "{e}");
}

/// Prompts of several lengths (and a sequence mid-decode with one new id) run in one
/// `forward_cached_many` pass against each run alone through it: the same bits
/// for each sequence's last logits and then for every later decode step, int8 at 93 rows a
/// pass and f32 at 23 (its few-rows products; longer f32 products sum in blocks of the
/// batch's size). A named adapter on one sequence stays its own.
#[test]
fn several_prompts_prefill_in_one_pass_as_each_does_alone() {
    let dir = TempDir::new("many_lora");
    let mut t = model(128, 15);
    t.add_lora(LoraConfig::new(2)).unwrap();
    let mut rng = Rng::new(16);
    for _ in 0..3 {
        let seqs: Vec<Vec<u32>> = (0..2).map(|_| (0..17).map(|_| rng.below(48) as u32).collect()).collect();
        t.train_step(&seqs).unwrap();
    }
    t.save_lora(dir.join("a.rbl")).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (q8, lens) in [(true, vec![40usize, 50, 1, 2]), (false, vec![3, 7, 12, 1])] {
        let mut m = model(128, 15);
        if q8 {
            m.quantize().unwrap();
        }
        m.load_named_lora("a", dir.join("a.rbl")).unwrap();
        let picks = [None, Some("a"), None, Some("a")];
        // The third and fourth sequences are mid-decode: five positions already cached.
        let head: Vec<u32> = (0..5).map(|i| i * 3 + 1).collect();
        let pieces: Vec<Vec<u32>> =
            lens.iter().map(|&n| (0..n).map(|_| rng.below(48) as u32).collect()).collect();
        let (mut together, mut alone): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
        for (i, pick) in picks.iter().enumerate() {
            let (mut a, mut b) = (m.new_kv_caches(), m.new_kv_caches());
            if i >= 2 {
                m.forward_cached_with(&head, &mut a, *pick).unwrap();
                m.forward_cached_with(&head, &mut b, *pick).unwrap();
            }
            together.push(a);
            alone.push(b);
        }
        let refs: Vec<&[u32]> = pieces.iter().map(Vec::as_slice).collect();
        let mut rows: Vec<&mut _> = together.iter_mut().collect();
        let logits = m.forward_cached_many(&refs, &mut rows, &picks).unwrap();
        assert_eq!(logits.len(), 4 * 48);
        for i in 0..4 {
            let want = m.forward_cached_many(&[&pieces[i]], &mut [&mut alone[i]], &picks[i..i + 1]).unwrap();
            assert_eq!(bits(&logits[i * 48..(i + 1) * 48]), bits(&want), "q8 {q8}: sequence {i}'s prefill");
            assert_eq!(together[i].len(), alone[i].len());
        }
        for step in 0..2u32 {
            let ids: Vec<u32> = (0..4).map(|i| (step * 5 + i * 3) % 48).collect();
            let mut rows: Vec<&mut _> = together.iter_mut().collect();
            let logits = m.forward_cached_rows_with(&ids, &mut rows, &picks).unwrap();
            for i in 0..4 {
                let want = m.forward_cached_with(&ids[i..i + 1], &mut alone[i], picks[i]).unwrap();
                assert_eq!(
                    bits(&logits[i * 48..(i + 1) * 48]),
                    bits(&want),
                    "q8 {q8}: step {step}, sequence {i}"
                );
            }
        }
    }
    // Refused: an empty piece, a piece over the limit; nothing changes.
    let mut m = model(512, 15);
    let (mut a, mut b) = (m.new_kv_caches(), m.new_kv_caches());
    assert_eq!(m.piece_limit(), 256);
    let long: Vec<u32> = vec![1; 257];
    assert!(m.forward_cached_many(&[&[1], &[]], &mut [&mut a, &mut b], &[None, None]).is_err());
    let e = m.forward_cached_many(&[&[1], &long], &mut [&mut a, &mut b], &[None, None]).unwrap_err();
    assert!(e.to_string().contains("prefill it alone"), "{e}");
    assert_eq!((a.len(), b.len()), (0, 0));
}

/// A prompt that starts as an earlier one did continues from a copy of that cache's first
/// positions (`copy_kv_prefix`): on an int8 model, through `forward_cached_many`, the
/// logits a fresh prefill of the whole prompt gives, bit for bit, and the decode steps
/// after; a copy longer than the cache holds is
/// refused and changes nothing.
#[test]
fn a_copied_prefix_continues_as_a_fresh_prefill() {
    let mut m = model(64, 17);
    m.quantize().unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let first: Vec<u32> = (0..30).map(|i| (i * 7 + 3) % 48).collect();
    // Twenty new positions after the copied twenty: long enough that a backend may tile
    // a many-query attention call, which the cached passes over several sequences do not.
    let mut second = first[..20].to_vec();
    second.extend((0..20).map(|i| (i * 5 + 1) % 48));
    let mut earlier = m.new_kv_caches();
    m.forward_cached_many(&[&first], &mut [&mut earlier], &[None]).unwrap();
    let (mut reused, mut fresh) = (m.new_kv_caches(), m.new_kv_caches());
    m.copy_kv_prefix(&earlier, &mut reused, 20).unwrap();
    assert_eq!(reused.len(), 20);
    let a = m.forward_cached_many(&[&second[20..]], &mut [&mut reused], &[None]).unwrap();
    let b = m.forward_cached_many(&[&second], &mut [&mut fresh], &[None]).unwrap();
    assert_eq!(bits(&a), bits(&b), "the copied prefix's continuation");
    for id in [3u32, 40, 7] {
        let a = m.forward_cached(&[id], &mut reused).unwrap();
        let b = m.forward_cached(&[id], &mut fresh).unwrap();
        assert_eq!(bits(&a), bits(&b), "decoding {id} after the copied prefix");
    }
    let mut other = m.new_kv_caches();
    let e = m.copy_kv_prefix(&earlier, &mut other, 31).unwrap_err().to_string();
    assert!(e.contains("holds 30 positions"), "{e}");
    assert_eq!(other.len(), 0);
}
