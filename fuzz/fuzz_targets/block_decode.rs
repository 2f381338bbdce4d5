//! Every block decoder of the CPU codec on arbitrary bytes: the first byte picks the ggml type,
//! the rest are its blocks. Whole blocks dequantize to the right number of values (NaN and Inf
//! are valid outputs of arbitrary scales); any other length is an error. Never a panic or
//! out-of-bounds read (IQ grid indices and sign tables included).
#![no_main]

use gguf::GgmlType;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, blocks)) = data.split_first() else {
        return;
    };
    let types: Vec<GgmlType> = GgmlType::all()
        .iter()
        .copied()
        .filter(|&t| ggml_codec::supports(t))
        .collect();
    let ty = types[pick as usize % types.len()];
    let (elems, bytes) = (ty.block_size(), ty.type_size());
    let n_blocks = blocks.len() / bytes;
    let whole = &blocks[..n_blocks * bytes];
    let values = ggml_codec::dequantize_to_vec(ty, whole, n_blocks * elems)
        .expect("whole blocks of a supported type dequantize");
    assert_eq!(values.len(), n_blocks * elems);
    if blocks.len() != whole.len() {
        let mut out = vec![0f32; (n_blocks + 1) * elems];
        assert!(ggml_codec::dequantize(ty, blocks, &mut out).is_err());
    }
});
