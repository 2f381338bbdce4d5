//! The KV-cache step and attention kernels against float64 references: one
//! [`AttentionCase`] runs [`crate::launch_qk_rope_cache`] then [`crate::launch_attention`] on
//! random heads over a cache partly filled by "earlier tokens", and compares the queries, the
//! written and the untouched cache positions, and the attention output. A case is either one
//! sequence's rows (a prompt or a decode step) or a batch: one decode row in each of several
//! sequences' cache slots, at different positions; its cache is one block per slot or paged
//! in small blocks that the block table scatters (interleaved between slots, in descending
//! order, with spare blocks no slot holds).
use super::{rand_f32, read_f32_async};
use crate::{AttentionShape, KernelError, QkRopeShape, launch_qk_rope_cache};
use cubecl::client::Client;
use cubecl::prelude::*;

/// Tolerance of the attention checks: `|y - y_ref| <= ATTENTION_TOL * max(1, |y_ref|)` for
/// the normalised, rotated heads, and `<= ATTENTION_TOL * max |v|` for attention outputs.
pub const ATTENTION_TOL: f64 = 1e-5;

/// One attention check: `n` query rows at positions `past..past + n` of one sequence, or with
/// `batch` one row in each of `n` sequences (cache slots `n, n - 1, .., 1` of `n + 1`; slot 0
/// must stay untouched) at positions from `past / 2` to `past`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionCase {
    /// Query rows (tokens of this step).
    pub n: usize,
    /// Tokens already in the cache (the last row's sequence, in a batch).
    pub past: usize,
    /// One decode row per sequence instead of one sequence's rows.
    pub batch: bool,
    /// Scores with a key per unit ([`crate::attention::launch_attention_lanes`] with 1 lane)
    /// instead of a plane per key where the device runs plane ops
    /// ([`crate::attention::plane_lanes`]).
    pub key_per_unit: bool,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Values of each head RoPE rotates (the rest are copied).
    pub rope_dims: usize,
    /// Sliding window, if any.
    pub window: Option<usize>,
    /// Per-head RMSNorm of Q and K.
    pub norm: bool,
    /// NEOX pairing (else NORM).
    pub neox: bool,
    /// Scores soft-capped as `cap * tanh(score / cap)` (Gemma 2), if any.
    pub softcap: Option<u32>,
    /// Positions per block of a paged cache ([`crate::KvPaging`]); `None`: one block per slot.
    pub block: Option<usize>,
}

impl AttentionCase {
    /// A short label for tables.
    pub fn label(&self) -> String {
        format!(
            "{}{}n={} past={} heads={}/{} d={} rot={} window={} {}{}{}{}",
            if self.batch { "batch " } else { "" },
            if self.key_per_unit {
                "key-per-unit "
            } else {
                ""
            },
            self.n,
            self.past,
            self.n_head,
            self.n_head_kv,
            self.head_dim,
            self.rope_dims,
            self.window.map_or("-".into(), |w| w.to_string()),
            if self.neox { "neox" } else { "norm" },
            if self.norm { "+qk-norm" } else { "" },
            self.softcap
                .map_or(String::new(), |c| format!(" softcap={c}")),
            self.block.map_or(String::new(), |b| format!(" paged={b}"))
        )
    }
}

/// The cases `cargo xtask kernel-test --op attention` runs and the tests sample: 1 and 8
/// query rows (and a 37-row prefill), GQA ratios 1, 2 and 8, contexts shorter than one split,
/// not a multiple of it and several splits long ([`crate::attention::ATTENTION_SPLIT`]),
/// windows shorter and longer than the context, both RoPE pairings, with and without Q/K norm,
/// RoPE over whole heads and over their first values only (Qwen3.5: 16 of 64), soft-capped
/// scores (Gemma 2; caps small enough to bend these scores); batches of 1 to 8 sequences at
/// different positions; and paged caches, blocks of 16 and 64 positions (a split's keys over
/// several blocks, a block over several splits).
pub fn attention_cases() -> Vec<AttentionCase> {
    let case = |n, past, n_head, n_head_kv, head_dim, window, norm, neox| AttentionCase {
        n,
        past,
        batch: false,
        key_per_unit: false,
        n_head,
        n_head_kv,
        head_dim,
        rope_dims: head_dim,
        window,
        norm,
        neox,
        softcap: None,
        block: None,
    };
    vec![
        case(1, 0, 2, 2, 8, None, false, true),
        case(1, 9, 4, 2, 16, None, true, true),
        case(8, 5, 8, 1, 32, None, true, false),
        case(1, 300, 4, 4, 64, None, false, true),
        case(8, 292, 8, 1, 64, None, true, true),
        case(3, 600, 2, 1, 24, None, false, false),
        case(1, 299, 4, 2, 32, Some(100), true, true),
        case(8, 41, 4, 1, 16, Some(16), true, true),
        case(8, 20, 4, 1, 16, Some(512), true, true),
        case(1, 700, 2, 1, 32, Some(512), false, true),
        case(37, 3, 4, 2, 16, Some(20), true, true),
        AttentionCase {
            rope_dims: 16,
            ..case(8, 5, 4, 2, 64, None, true, true)
        },
        AttentionCase {
            rope_dims: 6,
            ..case(1, 30, 2, 1, 24, None, false, false)
        },
        AttentionCase {
            softcap: Some(2),
            ..case(8, 292, 4, 2, 128, None, false, true)
        },
        AttentionCase {
            softcap: Some(5),
            ..case(12, 3, 4, 2, 32, Some(8), false, true)
        },
        AttentionCase {
            batch: true,
            ..case(8, 300, 8, 1, 64, None, true, true)
        },
        AttentionCase {
            batch: true,
            softcap: Some(3),
            ..case(4, 40, 4, 2, 16, Some(16), false, true)
        },
        AttentionCase {
            batch: true,
            ..case(5, 40, 4, 2, 16, Some(16), false, false)
        },
        AttentionCase {
            batch: true,
            ..case(3, 700, 2, 1, 32, Some(512), true, true)
        },
        AttentionCase {
            batch: true,
            ..case(1, 9, 4, 4, 8, None, false, true)
        },
        AttentionCase {
            key_per_unit: true,
            ..case(8, 292, 8, 1, 64, None, true, true)
        },
        AttentionCase {
            key_per_unit: true,
            ..case(1, 299, 4, 2, 32, Some(100), true, true)
        },
        AttentionCase {
            key_per_unit: true,
            batch: true,
            ..case(5, 40, 4, 2, 16, Some(16), false, false)
        },
        AttentionCase {
            block: Some(16),
            ..case(8, 292, 8, 1, 64, None, true, true)
        },
        AttentionCase {
            block: Some(16),
            ..case(37, 3, 4, 2, 16, Some(20), true, true)
        },
        AttentionCase {
            block: Some(64),
            batch: true,
            ..case(8, 300, 8, 1, 64, None, true, true)
        },
        AttentionCase {
            block: Some(16),
            batch: true,
            softcap: Some(3),
            ..case(4, 40, 4, 2, 16, Some(16), false, true)
        },
        AttentionCase {
            block: Some(64),
            key_per_unit: true,
            batch: true,
            ..case(3, 700, 2, 1, 32, Some(512), true, true)
        },
    ]
}

impl AttentionCase {
    /// Cache slots, and each row's (slot, position).
    pub fn rows(&self) -> (usize, Vec<(usize, usize)>) {
        if self.batch {
            let n = self.n;
            let rows = (0..n)
                .map(|t| (n - t, self.past - (n - 1 - t) * self.past / (2 * n)))
                .collect();
            (n + 1, rows)
        } else {
            (1, (0..self.n).map(|t| (0, self.past + t)).collect())
        }
    }

    /// The paging of `slots` slots of `capacity` positions each, and its block table: one
    /// block per slot, or blocks of `block` positions, slot `c`'s block `i` being block
    /// `blocks - 1 - (i * slots + c)` (interleaved and descending), blocks 0 and 1 spare.
    pub fn paging(&self, slots: usize, capacity: usize) -> (crate::KvPaging, Vec<u32>) {
        match self.block {
            None => (
                crate::KvPaging::contiguous(slots, capacity),
                crate::KvPaging::contiguous_table(slots),
            ),
            Some(block) => {
                let width = capacity.div_ceil(block);
                let blocks = slots * width + 2;
                let table = (0..slots)
                    .flat_map(|c| (0..width).map(move |i| (blocks - 1 - (i * slots + c)) as u32))
                    .collect();
                let paging = crate::KvPaging {
                    slots,
                    width,
                    block,
                    blocks,
                };
                (paging, table)
            }
        }
    }
}

/// Runs `case` on `client` and returns the worst error as a fraction of its bound
/// ([`ATTENTION_TOL`]; <= 1 passes; NaN is infinite), over the rotated queries, the cache
/// (written positions against the reference, every other position unchanged) and the
/// attention output.
///
/// # Errors
/// Launch errors (shapes) or a failed read-back.
pub fn attention_error(
    client: &Client,
    case: AttentionCase,
    seed: u64,
) -> Result<f64, KernelError> {
    cubecl::future::block_on(attention_error_async(client, case, seed))
}

/// [`attention_error`] awaiting the read-backs (the browser's kernel checks).
///
/// # Errors
/// As [`attention_error`].
pub async fn attention_error_async(
    client: &Client,
    case: AttentionCase,
    seed: u64,
) -> Result<f64, KernelError> {
    let AttentionCase {
        n,
        past: _,
        batch: _,
        key_per_unit,
        n_head: nh,
        n_head_kv: nkv,
        head_dim: hd,
        rope_dims,
        window,
        norm,
        neox,
        softcap,
        block: _,
    } = case;
    let half = rope_dims / 2;
    let (slots, rows) = case.rows();
    let positions = rows.iter().map(|r| r.1 + 1).max().unwrap_or(0);
    let capacity = positions + 3;
    let first_key = |p: usize| window.map_or(0, |w| (p + 1).saturating_sub(w));
    let keys = rows
        .iter()
        .map(|&(_, p)| p + 1 - first_key(p))
        .max()
        .unwrap_or(1);
    let (paging, block_table) = case.paging(slots, capacity);
    // Cache row of position `p` of KV head `g` of slot `c`.
    let at = |c: usize, g: usize, p: usize| {
        let b = block_table[c * paging.width + p / paging.block] as usize;
        (g * paging.blocks + b) * paging.block + p % paging.block
    };
    let cache_len = paging
        .cache_values(nkv, hd)
        .ok_or_else(|| crate::shape_err("attention check", format!("{paging:?}")))?;
    // One stacked projection: [q heads | k heads | v heads] per token.
    let stride = (nh + 2 * nkv) * hd;
    let qkv: Vec<f32> = rand_f32(n * stride, seed).iter().map(|v| v * 3.0).collect();
    let q_norm: Vec<f32> = rand_f32(hd, seed + 1).iter().map(|v| 1.0 + v).collect();
    let k_norm: Vec<f32> = rand_f32(hd, seed + 2).iter().map(|v| 1.0 + v).collect();
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for i in 0..half {
            let a = p as f64 * 10_000f64.powf(-2.0 * i as f64 / rope_dims as f64);
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    let k_init = rand_f32(cache_len, seed + 3);
    let v_init = rand_f32(cache_len, seed + 4);
    // The rows, then the block table.
    let rows_u32: Vec<u32> = rows
        .iter()
        .flat_map(|&(c, p)| [c as u32, p as u32])
        .chain(block_table.iter().copied())
        .collect();

    let up = |v: &[f32]| client.create_from_slice(f32::as_bytes(v));
    let norms = [q_norm.as_slice(), k_norm.as_slice()].concat();
    let table = [cos.as_slice(), sin.as_slice()].concat();
    let (qkv_h, norms_h, table_h) = (up(&qkv), up(&norms), up(&table));
    let (k_h, v_h) = (up(&k_init), up(&v_init));
    let rows_h = client.create_from_slice(u32::as_bytes(&rows_u32));
    let q_h = client.empty(n * nh * hd * 4);
    let out_h = client.empty(n * nh * hd * 4);
    // SAFETY: each length is that of the buffer it names.
    let arg = |h: &cubecl::server::Handle, len: usize| unsafe {
        BufferArg::from_raw_parts(h.clone(), len)
    };
    launch_qk_rope_cache(
        client,
        arg(&qkv_h, qkv.len()),
        arg(&qkv_h, qkv.len()),
        arg(&norms_h, norms.len()),
        arg(&table_h, table.len()),
        arg(&rows_h, rows_u32.len()),
        arg(&q_h, n * nh * hd),
        arg(&k_h, k_init.len()),
        arg(&v_h, v_init.len()),
        QkRopeShape {
            n,
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
            rope_dims,
            qk_stride: stride,
            k_off: nh * hd,
            v_stride: stride,
            v_off: (nh + nkv) * hd,
            paging,
            positions,
        },
        norm.then_some(1e-6),
        neox,
    )?;
    let scale = 1.0 / (hd as f32).sqrt();
    let shape = AttentionShape {
        n,
        n_head: nh,
        n_head_kv: nkv,
        head_dim: hd,
        paging,
        window,
        keys,
    };
    let lanes = if key_per_unit {
        1
    } else {
        crate::attention::plane_lanes(client)
    };
    crate::attention::launch_attention_lanes(
        client,
        arg(&q_h, n * nh * hd),
        arg(&k_h, k_init.len()),
        arg(&v_h, v_init.len()),
        arg(&rows_h, rows_u32.len()),
        arg(&out_h, n * nh * hd),
        shape,
        scale,
        softcap.map(|c| c as f32),
        lanes,
    )?;
    let q_out = read_f32_async(client, q_h).await?;
    let k_cache = read_f32_async(client, k_h).await?;
    let v_cache = read_f32_async(client, v_h).await?;
    let out = read_f32_async(client, out_h).await?;

    let mut worst = 0f64;
    let mut note = |got: f32, want: f64, bound: f64| {
        let e = (got as f64 - want).abs() / (ATTENTION_TOL * bound);
        worst = if e.is_nan() {
            f64::INFINITY
        } else {
            worst.max(e)
        };
    };
    // Q and K: normalised and rotated in f64.
    let rotate = |src: &[f32], w: &[f32], pos: usize| -> Vec<f64> {
        let inv = if norm {
            let ss: f64 = src.iter().map(|&x| x as f64 * x as f64).sum();
            1.0 / (ss / hd as f64 + 1e-6).sqrt()
        } else {
            1.0
        };
        let x: Vec<f64> = (0..hd)
            .map(|d| src[d] as f64 * if norm { inv * w[d] as f64 } else { 1.0 })
            .collect();
        // Values past the rotated ones are copied.
        let mut y = x.clone();
        for i in 0..half {
            let (a, b) = if neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (c, s) = (cos[pos * half + i] as f64, sin[pos * half + i] as f64);
            y[a] = x[a] * c - x[b] * s;
            y[b] = x[a] * s + x[b] * c;
        }
        y
    };
    for (t, &(c, pos)) in rows.iter().enumerate() {
        let row = &qkv[t * stride..(t + 1) * stride];
        for h in 0..nh {
            let want = rotate(&row[h * hd..(h + 1) * hd], &q_norm, pos);
            for d in 0..hd {
                note(
                    q_out[(t * nh + h) * hd + d],
                    want[d],
                    want[d].abs().max(1.0),
                );
            }
        }
        for g in 0..nkv {
            let k = rotate(&row[(nh + g) * hd..(nh + g + 1) * hd], &k_norm, pos);
            let v = &row[(nh + nkv + g) * hd..(nh + nkv + g + 1) * hd];
            for d in 0..hd {
                let at = at(c, g, pos) * hd + d;
                note(k_cache[at], k[d], k[d].abs().max(1.0));
                note(v_cache[at], v[d] as f64, 1.0);
            }
        }
    }
    // Cache rows no token wrote keep what they held, bit for bit (every slot's other
    // positions, and the blocks no slot holds).
    let mut written = vec![false; cache_len / hd];
    for &(c, p) in &rows {
        for g in 0..nkv {
            written[at(c, g, p)] = true;
        }
    }
    let changed = (0..cache_len).any(|i| {
        !written[i / hd]
            && (k_cache[i].to_bits() != k_init[i].to_bits()
                || v_cache[i].to_bits() != v_init[i].to_bits())
    });
    // Attention over the cache as the kernel left it.
    let v_max = v_cache
        .iter()
        .fold(0f64, |m, v| m.max(v.abs() as f64))
        .max(1e-30);
    let rep = nh / nkv;
    for (t, &(c, p)) in rows.iter().enumerate() {
        let first = first_key(p);
        for h in 0..nh {
            let g = h / rep;
            let q = &q_out[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            let scores: Vec<f64> = (first..=p)
                .map(|j| {
                    let k = &k_cache[at(c, g, j) * hd..(at(c, g, j) + 1) * hd];
                    let dot: f64 = q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let s = dot * scale as f64;
                    match softcap {
                        Some(cap) => cap as f64 * (s / cap as f64).tanh(),
                        None => s,
                    }
                })
                .collect();
            let m = scores.iter().fold(f64::MIN, |a, &b| a.max(b));
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for d in 0..hd {
                let want: f64 = (first..=p)
                    .zip(&e)
                    .map(|(j, w)| w * v_cache[at(c, g, j) * hd + d] as f64)
                    .sum::<f64>()
                    / l;
                note(out[(t * nh + h) * hd + d], want, v_max);
            }
        }
    }
    Ok(if changed { f64::INFINITY } else { worst })
}
