//! Batched decode ([`Decoder::forward_batch`]): several sequences in one pass, each in its own
//! cache slot at its own position, give each sequence the greedy tokens and (within float
//! rounding) the logits it gets alone; on wgpu (the kernels) and on the CPU backend (the Burn-op
//! fallback), dense and MoE.
use burn::tensor::{Device, Tensor};
use burn_gguf::{GgufConfig, GgufLoader};
use burn_gguf_models::{BatchState, Decoder, KV_BLOCK, SequenceState};
use burn_gguf_tests::{fixtures, max_abs_diff};
use gguf::GgufFile;

/// Prompts of different lengths (token ids of the tiny fixtures' vocabulary).
const PROMPTS: [&[u32]; 5] = [
    &[347, 302, 220, 84, 79, 78, 77, 259, 256, 373],
    &[12, 99, 5],
    &[7],
    &[
        200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212,
    ],
    &[31, 41, 59, 26, 53],
];
const STEPS: usize = 12;

fn rows(logits: Tensor<2>) -> Vec<Vec<f32>> {
    let [n, vocab] = logits.dims();
    let v = logits.into_data().try_to_vec::<f32>().unwrap();
    (0..n)
        .map(|r| v[r * vocab..(r + 1) * vocab].to_vec())
        .collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy ids and the logits of every step of `prompt` alone.
fn alone(model: &Decoder, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut state = SequenceState::new();
    let mut logits = rows(model.forward(prompt, &mut state, false).unwrap());
    let (mut ids, mut all) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        let row = logits.remove(0);
        let id = argmax(&row);
        ids.push(id);
        all.push(row);
        logits = rows(model.forward(&[id], &mut state, false).unwrap());
    }
    (ids, all)
}

/// The same, all prompts in one state: every prompt prefilled in one pass (slots in reverse
/// order, so slot and row order differ), then one pass per step for all sequences; the third
/// sequence leaves after 4 steps and its slot is reused by the first prompt again.
fn batched(model: &Decoder) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let n = PROMPTS.len();
    let mut state = BatchState::new(n);
    let slot = |i: usize| n - 1 - i;
    let seqs: Vec<(usize, &[u32])> = PROMPTS
        .iter()
        .enumerate()
        .map(|(i, p)| (slot(i), *p))
        .collect();
    let mut logits = rows(model.forward_batch(&mut state, &seqs, false).unwrap());
    let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![(Vec::new(), Vec::new()); n + 1];
    let mut running: Vec<usize> = (0..n).collect();
    for step in 0..STEPS + 4 {
        let mut next = Vec::new();
        for (row, &i) in logits.into_iter().zip(&running) {
            let id = argmax(&row);
            if out[i].0.len() < STEPS {
                out[i].0.push(id);
                out[i].1.push(row);
            }
            next.push((i, id));
        }
        if step == 3 {
            // Sequence 2 leaves; sequence n (prompt 0 again) takes its slot from scratch.
            next.retain(|&(i, _)| i != 2);
            assert_eq!(state.truncate(slot(2), 0), 0);
            let first = rows(
                model
                    .forward_batch(&mut state, &[(slot(2), PROMPTS[0])], false)
                    .unwrap(),
            );
            next.push((n, argmax(&first[0])));
            out[n].0.push(argmax(&first[0]));
            out[n].1.push(first[0].clone());
        }
        next.retain(|&(i, _)| out[i].0.len() < STEPS);
        if next.is_empty() {
            break;
        }
        running = next.iter().map(|&(i, _)| i).collect();
        let ids: Vec<[u32; 1]> = next.iter().map(|&(_, id)| [id]).collect();
        let slot_of = |i: usize| if i == n { slot(2) } else { slot(i) };
        let seqs: Vec<(usize, &[u32])> = next
            .iter()
            .zip(&ids)
            .map(|(&(i, _), id)| (slot_of(i), &id[..]))
            .collect();
        logits = rows(model.forward_batch(&mut state, &seqs, false).unwrap());
    }
    out
}

fn check(device: &Device, name: &str, tol: f32) {
    let file = GgufFile::open(fixtures().join(format!("gguf/{name}.gguf"))).unwrap();
    let loader = GgufLoader::new(&file, device, GgufConfig::default());
    let model = Decoder::load(&loader).unwrap();
    let together = batched(&model);
    for (i, (ids, logits)) in together.iter().enumerate() {
        let prompt = PROMPTS[i % PROMPTS.len()];
        let (want_ids, want_logits) = alone(&model, prompt);
        // Sequence 2 left after 4 tokens; the others ran all steps.
        let steps = if i == 2 { 4 } else { STEPS };
        assert_eq!(ids.len(), steps, "{name}: sequence {i}");
        assert_eq!(
            ids[..],
            want_ids[..steps],
            "{name}: sequence {i} batched and alone"
        );
        for (step, (got, want)) in logits.iter().zip(&want_logits).enumerate() {
            let d = max_abs_diff(got, want);
            assert!(
                d <= tol,
                "{name}: sequence {i} step {step}: max |logit diff| {d}"
            );
        }
    }
}

#[test]
fn batched_decode_equals_each_sequence_alone_on_wgpu() {
    let device = burn_gguf::default_device();
    check(&device, "tiny-qwen3-Q8_0", 1e-4);
    check(&device, "tiny-qwen3-Q4_K_M", 1e-4);
    check(&device, "tiny-qwen3moe-Q4_0", 1e-4);
}

#[test]
fn batched_decode_equals_each_sequence_alone_on_the_cpu_backend() {
    check(&Device::flex(), "tiny-qwen3-Q8_0", 1e-4);
}

/// More sequences than one GEMV pass takes (20 rows: passes of 8, 8 and 4 over views of the
/// activations), greedy and logits as alone, for a few steps.
#[test]
fn twenty_sequences_in_gemv_passes() {
    let device = burn_gguf::default_device();
    let file = GgufFile::open(fixtures().join("gguf/tiny-qwen3-Q8_0.gguf")).unwrap();
    let model = Decoder::load(&GgufLoader::new(&file, &device, GgufConfig::default())).unwrap();
    let prompts: Vec<Vec<u32>> = (0..20u32)
        .map(|i| {
            (0..1 + i % 4)
                .map(|j| (i * 17 + j * 31 + 3) % 384)
                .collect()
        })
        .collect();
    let mut state = BatchState::new(prompts.len());
    let mut last: Vec<u32> = Vec::new();
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    for step in 0..4 {
        let ids: Vec<[u32; 1]> = last.iter().map(|&id| [id]).collect();
        let seqs: Vec<(usize, &[u32])> = if step == 0 {
            prompts
                .iter()
                .enumerate()
                .map(|(s, p)| (s, &p[..]))
                .collect()
        } else {
            ids.iter().enumerate().map(|(s, id)| (s, &id[..])).collect()
        };
        let logits = rows(model.forward_batch(&mut state, &seqs, false).unwrap());
        last = logits.iter().map(|r| argmax(r)).collect();
        for (s, row) in logits.into_iter().enumerate() {
            got[s].push(row);
        }
    }
    for (s, p) in prompts.iter().enumerate() {
        let mut state = SequenceState::new();
        let mut input = p.clone();
        for (step, row) in got[s].iter().enumerate() {
            let want = rows(model.forward(&input, &mut state, false).unwrap()).remove(0);
            let d = max_abs_diff(row, &want);
            assert!(d <= 1e-4, "sequence {s} step {step}: max |logit diff| {d}");
            input = vec![argmax(&want)];
        }
    }
}

#[test]
fn forward_batch_rejects_bad_slots() {
    let device = burn_gguf::default_device();
    let file = GgufFile::open(fixtures().join("gguf/tiny-qwen3-Q8_0.gguf")).unwrap();
    let model = Decoder::load(&GgufLoader::new(&file, &device, GgufConfig::default())).unwrap();
    let mut state = BatchState::new(2);
    let e = model
        .forward_batch(&mut state, &[(2, &[1u32][..])], false)
        .unwrap_err();
    assert!(e.to_string().contains("slot 2"), "{e}");
    let e = model
        .forward_batch(&mut state, &[(0, &[1u32][..]), (0, &[2u32][..])], false)
        .unwrap_err();
    assert!(e.to_string().contains("twice"), "{e}");
    assert!(model.forward_batch(&mut state, &[], false).is_err());
    // Nothing ran: both slots are still empty.
    assert_eq!((state.len(0), state.len(1)), (0, 0));
}

/// The paged KV cache holds what the sequences hold: with 1,024 slots, one slot runs past the
/// share an unpaged cache (`[slots * n_head_kv, positions, head_dim]` in the device's largest
/// buffer) would give it, and the caches grow with the positions held, not slots times the
/// longest (`Decoder::max_kv_positions`). Under a limit (`BatchState::with_limit`), a pass past
/// the free blocks is an error that leaves the state as it was, and blocks given back by
/// `truncate` serve another slot.
#[test]
fn paged_kv_cache_holds_what_the_sequences_hold() {
    let device = burn_gguf::default_device();
    let file = GgufFile::open(fixtures().join("gguf/tiny-qwen3-Q8_0.gguf")).unwrap();
    let model = Decoder::load(&GgufLoader::new(&file, &device, GgufConfig::default())).unwrap();
    let c = model.config();
    let max_buffer = burn_gguf::max_buffer_bytes(&device).expect("a CubeCL device");
    let per_position = (c.n_head_kv * c.head_dim * 4) as u64;
    let max_kv = model.max_kv_positions();
    assert_eq!(
        max_kv,
        (max_buffer / per_position) as usize / KV_BLOCK * KV_BLOCK
    );
    let ids = |n: usize, seed: u32| -> Vec<u32> {
        (0..n as u32).map(|i| 10 + (i * 7 + seed) % 300).collect()
    };
    let logits_alone = |prompt: &[u32]| {
        let mut alone = SequenceState::new();
        rows(model.forward(prompt, &mut alone, false).unwrap()).remove(0)
    };

    // 1,024 slots: an unpaged cache would give each this many positions.
    let slots = 1024;
    let share = (max_buffer / (slots as u64 * per_position)) as usize;
    let long = ids(share + 40, 1);
    assert!(long.len() < c.context_length);
    let mut state = BatchState::new(slots);
    let logits = model
        .forward_batch(
            &mut state,
            &[(0, &long[..]), (slots - 1, &long[..3])],
            false,
        )
        .unwrap();
    assert_eq!((state.len(0), state.len(slots - 1)), (long.len(), 3));
    // The blocks of the positions held, not of every slot.
    let held = long.len().div_ceil(KV_BLOCK) + 1;
    assert_eq!(state.capacity(), held * KV_BLOCK);
    let got = rows(logits);
    assert!(max_abs_diff(&got[0], &logits_alone(&long)) <= 1e-4);
    assert!(max_abs_diff(&got[1], &logits_alone(&long[..3])) <= 1e-4);

    // A limit of 4 blocks, all taken by slot 0.
    let mut state = BatchState::new(4).with_limit(4 * KV_BLOCK);
    let first = ids(4 * KV_BLOCK - 20, 2);
    model
        .forward_batch(&mut state, &[(0, &first[..])], false)
        .unwrap();
    assert_eq!(state.held(0), 4 * KV_BLOCK);
    let too_long = ids(4 * KV_BLOCK + 1, 3);
    let e = model
        .forward_batch(&mut state, &[(1, &too_long[..])], false)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("{} positions", 4 * KV_BLOCK)), "{e}");
    let e = model
        .forward_batch(&mut state, &[(1, &[5u32][..])], false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("0 of them are free"), "{e}");
    // Nothing changed: slot 0 goes on as its prompt alone would.
    assert_eq!((state.len(0), state.len(1)), (first.len(), 0));
    let next = model
        .forward_batch(&mut state, &[(0, &[7u32][..])], false)
        .unwrap();
    let mut with_next = first.clone();
    with_next.push(7);
    assert!(max_abs_diff(&rows(next)[0], &logits_alone(&with_next)) <= 1e-4);
    // Cut to one block, slot 0 gives three back, which slot 1 takes.
    assert_eq!(state.truncate(0, KV_BLOCK - 4), KV_BLOCK - 4);
    assert_eq!(state.held(0), KV_BLOCK);
    let second = ids(3 * KV_BLOCK - 10, 4);
    let out = model
        .forward_batch(&mut state, &[(1, &second[..])], false)
        .unwrap();
    assert!(max_abs_diff(&rows(out)[0], &logits_alone(&second)) <= 1e-4);
}

/// Sequences whose blocks are scattered in the pool (slots that grew in turns, then another
/// slot taking the blocks one of them gave back) decode what they decode alone: a prompt's
/// attention through the matmul path gathers its blocks, the decode steps go through the
/// kernel's block table, and a slot grows into a block past the others'.
fn scattered_blocks(device: &Device, tol: f32) {
    let file = GgufFile::open(fixtures().join("gguf/tiny-qwen3-Q8_0.gguf")).unwrap();
    let model = Decoder::load(&GgufLoader::new(&file, device, GgufConfig::default())).unwrap();
    let ids = |n: usize, seed: u32| -> Vec<u32> {
        (0..n as u32).map(|i| 10 + (i * 11 + seed) % 300).collect()
    };
    let (a, b, c) = (
        ids(3 * KV_BLOCK, 1),
        ids(3 * KV_BLOCK, 2),
        ids(2 * KV_BLOCK + 9, 3),
    );
    let mut state = BatchState::new(3);
    // Slots 0 and 1 take a block each in turn: blocks 0, 2, 4 and 1, 3, 5.
    let mut b_logits = Vec::new();
    for k in 0..3 {
        for (slot, seq) in [(0, &a), (1, &b)] {
            let part = &seq[k * KV_BLOCK..(k + 1) * KV_BLOCK];
            let out = rows(
                model
                    .forward_batch(&mut state, &[(slot, part)], false)
                    .unwrap(),
            );
            if slot == 1 {
                b_logits = out[0].clone();
            }
        }
    }
    assert_eq!(state.table(1), &[1, 3, 5]);
    // Slot 0 leaves; slot 2 takes its blocks, which do not follow each other.
    state.truncate(0, 0);
    let out = model.forward_batch(&mut state, &[(2, &c[..])], false);
    let c_logits = rows(out.unwrap()).remove(0);
    assert_eq!(state.table(2), &[0, 2, 4]);
    let want = [alone(&model, &b), alone(&model, &c)];
    let mut last = [b_logits, c_logits];
    let mut got = [Vec::new(), Vec::new()];
    for step in 0..STEPS {
        for k in 0..2 {
            let d = max_abs_diff(&last[k], &want[k].1[step]);
            assert!(
                d <= tol,
                "slot {}: step {step}: max |logit diff| {d}",
                k + 1
            );
            got[k].push(argmax(&last[k]));
        }
        let next = [got[0][step], got[1][step]];
        let out = model.forward_batch(&mut state, &[(1, &next[..1]), (2, &next[1..])], false);
        let mut r = rows(out.unwrap());
        last = [r.remove(0), r.remove(0)];
    }
    // Slot 1 went past its third block into one past slot 2's.
    assert_eq!(state.table(1), &[1, 3, 5, 6]);
    assert_eq!(got[0], want[0].0, "slot 1: greedy ids");
    assert_eq!(got[1], want[1].0, "slot 2: greedy ids");
}

#[test]
fn scattered_blocks_decode_as_alone_on_wgpu() {
    scattered_blocks(&burn_gguf::default_device(), 1e-4);
}

#[test]
fn scattered_blocks_decode_as_alone_on_the_cpu_backend() {
    scattered_blocks(&Device::flex(), 1e-4);
}

/// A slot saved ([`BatchState::save_slot`]), overwritten by another prompt and loaded into
/// another slot ([`BatchState::load_slot`]) decodes what the prompt decodes alone, and an
/// attention-only model can also resume from a prefix of it; a snapshot of another model does
/// not load. The prefix store of `serve --cache-memory` relies on this.
#[test]
fn a_saved_slot_resumes_in_another_slot() {
    let device = burn_gguf::default_device();
    let open = |path: &str| {
        let file = GgufFile::open(fixtures().join(path)).unwrap();
        Decoder::load(&GgufLoader::new(&file, &device, GgufConfig::default())).unwrap()
    };
    let qwen3 = open("gguf/tiny-qwen3-Q8_0.gguf");
    let qwen35 = open("arch/tiny-qwen35-Q8_0.gguf");
    let prompt = PROMPTS[0];
    let decode = |model: &Decoder, state: &mut BatchState, slot: usize, mut logits: Vec<f32>| {
        let (mut ids, mut all) = (Vec::new(), Vec::new());
        for _ in 0..STEPS {
            let id = argmax(&logits);
            ids.push(id);
            all.push(logits);
            let out = model.forward_batch(state, &[(slot, &[id][..])], false);
            logits = rows(out.unwrap()).remove(0);
        }
        (ids, all)
    };
    let mut other_snapshot = None;
    for (name, model, recurrent) in [("qwen3", &qwen3, false), ("qwen35", &qwen35, true)] {
        let (want_ids, want_logits) = alone(model, prompt);
        let mut state = BatchState::new(3);
        let last = rows(
            model
                .forward_batch(&mut state, &[(0, prompt)], false)
                .unwrap(),
        )
        .remove(0);
        state.checkpoint(0);
        let snapshot = state.save_slot(0).expect("a slot holding a prompt saves");
        assert_eq!(snapshot.len(), prompt.len(), "{name}");
        assert_eq!(snapshot.is_recurrent(), recurrent, "{name}");
        assert!(snapshot.bytes() > 0, "{name}");
        // Slot 0 goes to another prompt; the copy still holds the first.
        state.truncate(0, 0);
        model
            .forward_batch(&mut state, &[(0, PROMPTS[1])], false)
            .unwrap();
        assert_eq!(state.load_slot(2, &snapshot), prompt.len(), "{name}");
        let (ids, logits) = decode(model, &mut state, 2, last);
        assert_eq!(ids, want_ids, "{name}: greedy ids after loading the slot");
        for (step, (got, want)) in logits.iter().zip(&want_logits).enumerate() {
            let d = max_abs_diff(got, want);
            assert!(d <= 1e-4, "{name}: step {step}: max |logit diff| {d}");
        }
        if recurrent {
            // Another model's snapshot does not load, and leaves the slot empty.
            let other: &burn_gguf_models::SlotSnapshot = other_snapshot.as_ref().unwrap();
            assert_eq!(
                state.load_slot(1, other),
                0,
                "{name}: another model's snapshot"
            );
            assert_eq!(state.len(1), 0);
        } else {
            // Attention only: resume from the first 4 positions and feed the rest.
            assert_eq!(state.load_slot(1, &snapshot), prompt.len());
            assert_eq!(state.truncate(1, 4), 4);
            let out = model.forward_batch(&mut state, &[(1, &prompt[4..])], false);
            let (ids, _) = decode(model, &mut state, 1, rows(out.unwrap()).remove(0));
            assert_eq!(
                ids, want_ids,
                "{name}: greedy ids from a prefix of the snapshot"
            );
            other_snapshot = Some(snapshot);
        }
    }
}
