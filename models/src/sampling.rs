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

    /// llama.cpp's order after top-k: softmax with the temperature, top-p, then one draw.
    fn pick(&mut self, candidates: &[(f32, u32)]) -> u32 {
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
        let total: f64 = probs.iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (p, &(_, id)) in probs.iter().zip(candidates) {
            if r < *p {
                return id;
            }
            r -= p;
        }
        candidates[probs.len() - 1].1
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
}
