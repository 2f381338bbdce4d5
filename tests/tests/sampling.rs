//! Sampling from the device's top-k candidates ([`sample_from`] with [`SampleFrom::Candidates`]:
//! `k` values and ids read back)
//! draws the same tokens as the host sampler over the whole row, seed for seed: a
//! vocabulary of 65,537 logits with ties, NaN and infinities, for the configurations a
//! server sees (llama.cpp's defaults, a small `top_k`, `top_p` 1, a high temperature), and
//! `top_k` 0, which reads the row back.
use burn::tensor::{Tensor, TensorData};
use burn_gguf_models::generate::{SampleFrom, sample_from};
use burn_gguf_models::sampling::{Sampler, SamplerConfig};
use burn_gguf_tests::rand_vec;

#[test]
fn device_candidates_draw_what_the_row_draws() {
    let device = burn_gguf::default_device();
    // 17 chunks of the first pass, the last of one value.
    let n = 65_537;
    // Logits on a coarse grid (many ties), a few of them non-finite.
    let mut row: Vec<f32> = rand_vec(n, 7)
        .iter()
        .map(|v| (v * 40.0).round() / 8.0)
        .collect();
    row[11] = f32::NAN;
    row[12] = f32::INFINITY;
    row[13] = f32::NEG_INFINITY;
    let logits = Tensor::<2>::from_data(TensorData::new(row.clone(), [1, n]), &device);
    let configs = [
        (0.8, 40, 0.95),
        (1.0, 5, 1.0),
        (2.5, 100, 0.9),
        (0.7, 0, 0.5),
    ];
    for (temperature, top_k, top_p) in configs {
        for seed in [0u64, 42] {
            let config = SamplerConfig {
                temperature,
                top_k,
                top_p,
                seed,
            };
            let (mut host, mut device_side) = (Sampler::new(config.clone()), Sampler::new(config));
            let want: Vec<u32> = (0..24).map(|_| host.sample(&row)).collect();
            let got: Vec<u32> = (0..24)
                .map(|_| {
                    sample_from(logits.clone(), &mut device_side, SampleFrom::Candidates)
                        .expect("sample")
                })
                .collect();
            assert_eq!(
                got, want,
                "t {temperature} top_k {top_k} top_p {top_p} seed {seed}"
            );
            // Real draws from a set of candidates, not the argmax every time.
            assert!(want.iter().any(|&t| t != want[0]), "{want:?}");
        }
    }
}
