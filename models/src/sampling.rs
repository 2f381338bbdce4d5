//! Token sampling: greedy, or seeded temperature / top-k / top-p (llama.cpp's order:
//! top-k, then top-p, then temperature).
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Sampling parameters. `temperature <= 0` is greedy (argmax).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `0` for greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (`0` keeps all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability adds up to at least `top_p` (`1` keeps all).
    pub top_p: f32,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Whether this config picks the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// A sampler with its own seeded random generator: the same seed and logits give the same tokens.
pub struct Sampler {
    config: SamplerConfig,
    rng: StdRng,
}

/// Index of the largest value (the first one on ties); NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    /// A sampler for `config`.
    pub fn new(config: SamplerConfig) -> Self {
        let rng = StdRng::seed_from_u64(config.seed);
        Self { config, rng }
    }

    /// The parameters.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Picks a token id from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.config.is_greedy() || logits.len() <= 1 {
            return argmax(logits);
        }
        let k = match self.config.top_k {
            0 => logits.len(),
            k => k,
        };
        let candidates = burn_gguf::sampling::top_k_row(logits, k);
        if candidates.is_empty() {
            return argmax(logits);
        }
        self.pick(&candidates)
    }

    /// Picks a token id from the best candidates of a row, `(logit, id)` in the order of
    /// [`burn_gguf::top_k`] (larger logit first, then smaller id; finite logits only). Given at
    /// least `top_k` candidates (all of the row's finite logits when `top_k` is 0), or all of
    /// them when the row has fewer, this draws exactly what [`Sampler::sample`] draws from the
    /// whole row with the same generator state. Greedy takes the first.
    ///
    /// # Panics
    /// If `candidates` is empty.
    pub fn sample_candidates(&mut self, candidates: &[(f32, u32)]) -> u32 {
        assert!(!candidates.is_empty(), "sample_candidates: no candidates");
        if self.config.is_greedy() {
            return candidates[0].1;
        }
        let k = match self.config.top_k {
            0 => candidates.len(),
            k => k.min(candidates.len()),
        };
        self.pick(&candidates[..k])
    }

    /// Speculative sampling's test of a drafted token `draft` against the candidates of the
    /// row that predicts it (as [`Sampler::sample_candidates`] takes them): with `p` the
    /// distribution [`Sampler::sample_candidates`] draws from, `draft` is kept with
    /// probability `p(draft)` (`None`), else a token is drawn from `p` with `draft` taken out
    /// and renormalised (`Some(id)`). Over both outcomes each token comes out with probability
    /// `p`, exactly as a plain draw (Leviathan et al. 2023, "Fast Inference from Transformers
    /// via Speculative Decoding", for a draft distribution that puts all its mass on `draft`).
    /// Greedy keeps `draft` when it is the first candidate.
    ///
    /// # Panics
    /// If `candidates` is empty.
    pub fn accept_draft(&mut self, candidates: &[(f32, u32)], draft: u32) -> Option<u32> {
        assert!(!candidates.is_empty(), "accept_draft: no candidates");
        if self.config.is_greedy() {
            let best = candidates[0].1;
            return (best != draft).then_some(best);
        }
        let k = match self.config.top_k {
            0 => candidates.len(),
            k => k.min(candidates.len()),
        };
        let candidates = &candidates[..k];
        let mut probs = self.distribution(candidates);
        let total: f64 = probs.iter().sum();
        let at = candidates[..probs.len()]
            .iter()
            .position(|&(_, id)| id == draft);
        let p_draft = at.map_or(0.0, |i| probs[i] / total);
        if self.rng.random::<f64>() < p_draft {
            return None;
        }
        if let Some(i) = at {
            probs[i] = 0.0;
        }
        if probs.iter().sum::<f64>() <= 0.0 {
            // `draft` held all the mass (then the draw above kept it, up to rounding).
            return None;
        }
        Some(self.draw(&probs, candidates))
    }

    /// llama.cpp's order after top-k: softmax with the temperature, top-p, then one draw.
    fn pick(&mut self, candidates: &[(f32, u32)]) -> u32 {
        let probs = self.distribution(candidates);
        self.draw(&probs, candidates)
    }

    /// The probabilities of `candidates` (best first) after the temperature's softmax and
    /// top-p, which keeps a prefix of them: one value per kept candidate, adding up to 1.
    fn distribution(&self, candidates: &[(f32, u32)]) -> Vec<f64> {
        let t = self.config.temperature as f64;
        let max = candidates[0].0 as f64;
        let mut probs: Vec<f64> = candidates
            .iter()
            .map(|&(v, _)| ((v as f64 - max) / t).exp())
            .collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        if self.config.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs
                .iter()
                .position(|p| {
                    acc += p;
                    acc >= self.config.top_p as f64
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        probs
    }

    /// One draw from `probs` (not necessarily normalised; one per leading candidate).
    fn draw(&mut self, probs: &[f64], candidates: &[(f32, u32)]) -> u32 {
        let total: f64 = probs.iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (p, &(_, id)) in probs.iter().zip(candidates) {
            if r < *p {
                return id;
            }
            r -= p;
        }
        // Rounding left `r` past the end: the last candidate with any mass.
        let last = probs.iter().rposition(|&p| p > 0.0).unwrap_or(0);
        candidates[last].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_max() {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.5).collect();
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            seed: 42,
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(cfg.clone());
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(cfg);
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        // top-3 of the logits are the first three indices with value 3.0 (i % 7 == 6).
        assert!(a.iter().all(|&i| [6, 13, 20].contains(&i)), "{a:?}");
    }

    #[test]
    fn top_p_keeps_the_smallest_sufficient_set() {
        // probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.5 keeps only the first.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 7,
        });
        assert!((0..100).all(|_| s.sample(&logits) == 0));
    }

    /// Drafting `d` and testing it with `accept_draft` draws each token with the sampler's
    /// own probabilities: the empirical distribution of 200 000 verdicts matches the softmax
    /// (after top-k and top-p, renormalised) within 0.006 (about 5 standard deviations), for a
    /// likely, an unlikely and an excluded draft.
    #[test]
    fn accepted_drafts_keep_the_distribution() {
        let logits = [2.0f32, 1.5, 1.0, 0.2, -1.0, -3.0];
        let cfg = SamplerConfig {
            temperature: 0.9,
            top_k: 5,
            top_p: 0.97,
            seed: 11,
        };
        let candidates = burn_gguf::sampling::top_k_row(&logits, 5);
        let expected = {
            let s = Sampler::new(cfg.clone());
            // Top-p keeps a prefix of the candidates; a draw is from what it keeps.
            let p = s.distribution(&candidates);
            let total: f64 = p.iter().sum();
            let mut e = vec![0.0; logits.len()];
            for (p, &(_, id)) in p.iter().zip(&candidates) {
                e[id as usize] = *p / total;
            }
            e
        };
        assert_eq!(expected[5], 0.0);
        for draft in [0u32, 3, 5] {
            let mut s = Sampler::new(cfg.clone());
            let mut counts = [0usize; 6];
            let n = 200_000;
            for _ in 0..n {
                let t = s.accept_draft(&candidates, draft).unwrap_or(draft);
                counts[t as usize] += 1;
            }
            for (id, &c) in counts.iter().enumerate() {
                let got = c as f64 / n as f64;
                assert!(
                    (got - expected[id]).abs() < 0.006,
                    "draft {draft}: token {id} {got} against {}",
                    expected[id]
                );
            }
        }
    }
}
