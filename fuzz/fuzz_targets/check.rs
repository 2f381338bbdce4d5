//! What every fuzz target asserts about a file the reader accepted.

use gguf::GgufFile;

/// Every accessor of an accepted file stays in bounds and consistent: tensor data has the
/// declared size and lies inside the file, shapes agree, and typed getters return values or
/// errors (never panic).
pub fn accepted(f: &GgufFile) {
    let len = f.file_size();
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes, "{}", t.name);
        assert!(f.tensor_file_offset(t) + t.n_bytes <= len, "{}", t.name);
        assert_eq!(t.shape().len(), t.ne.len());
        assert!(f.tensor(&t.name).is_some_and(|u| std::ptr::eq(u, t)));
        let _ = (t.n_elements(), t.n_rows(), t.row_len());
    }
    for (k, v) in f.metadata() {
        let _ = v.value_type_name();
        let _ = (
            f.get_u32(k),
            f.get_u64(k),
            f.get_i64(k),
            f.get_f32(k),
            f.get_bool(k),
        );
        let _ = (f.get_str(k), f.get_array(k), f.get_str_array(k));
        let _ = (f.get_f32_array(k), f.get_i32_array(k));
        assert!(f.get(k).is_some_and(|u| std::ptr::eq(u, v)), "{k}");
    }
    let _ = f.architecture();
}
