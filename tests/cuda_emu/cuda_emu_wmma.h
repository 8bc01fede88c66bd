// cuda_emu_wmma.h: the subset of nvcuda::wmma (<mma.h>) the kernels use, for the emulator
// (included by cuda_emu.h; kernels include <mma.h> under nvcc instead).
//
// Supported: fragment<matrix_a | matrix_b, 16, 16, 16, __nv_bfloat16, row_major | col_major>,
// fragment<accumulator, 16, 16, 16, float>, fill_fragment, load_matrix_sync,
// store_matrix_sync, mma_sync (D = A B + C). Anything else does not compile.
//
// Semantics, as the CUDA C++ Programming Guide ("Warp Matrix Functions") states them:
//   - load_matrix_sync, store_matrix_sync and mma_sync are warp-collective: all 32 lanes of a
//     full warp call them with the same arguments (pointer, ldm, layout). Each is one
//     rendezvous (cuemu::warp_collective): lanes that never come are a deadlock; lanes at
//     different call sites are "divergent warp collectives"; lanes passing different
//     pointers or ldm, a pointer not 256-bit (32-byte) aligned, or ldm not a multiple of 16
//     bytes fail the launch.
//   - The mapping of fragment elements (x[0..num_elements)) to matrix positions is OPAQUE on a
//     GPU. Here it is a random permutation drawn per launch and per fragment kind (matrix_a,
//     matrix_b, accumulator differ), so the three thread orders also see three layouts: code
//     that assumes a layout (e.g. reads an accumulator element as "row r") gives wrong
//     results or orders that disagree. Element-wise operations on x[] that treat every
//     element alike (scaling, conversion, fill) are layout-independent and fine.
//   - mma_sync: products of bf16 values are exact in fp32; they are summed into C in fp32,
//     k = 0..15 in order, one rounding per addition. A tensor core may add in another order
//     (and, on some GPUs, with truncation inside its adder tree): a few fp32 ulp of the
//     result, covered by the tests' fp32-level tolerances.
//   - num_elements = 8 for all three kinds (256 elements / 32 lanes), as for bf16 on sm_80+.
#pragma once

namespace cuemu {
struct WmmaReq {
    void *frag;                    // this lane's fragment (x[8])
    const void *a, *b, *c;         // mma_sync: this lane's A, B, C fragments (frag = D)
    void *ptr;                     // load/store: the matrix in memory
    unsigned ldm;
    int col_major;                 // memory layout
    int kind;                      // 0 matrix_a, 1 matrix_b, 2 accumulator
    int elem_bytes;                // 2 (bf16) or 4 (float)
};
const char *wmma_load(void *const *lanes, char *err, size_t n);
const char *wmma_store(void *const *lanes, char *err, size_t n);
const char *wmma_mma(void *const *lanes, char *err, size_t n);
} // namespace cuemu

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class T, int NE>
struct __frag_base {
    enum { num_elements = NE };
    typedef T element_type;
    typedef T storage_element_type;
    T x[NE];
};

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment;   // only the specialisations below exist
template <class L>
class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, L> : public __frag_base<__nv_bfloat16, 8> {};
template <class L>
class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, L> : public __frag_base<__nv_bfloat16, 8> {};
template <>
class fragment<accumulator, 16, 16, 16, float> : public __frag_base<float, 8> {};

namespace detail {
template <class U> struct use_kind;
template <> struct use_kind<matrix_a> { enum { value = 0 }; };
template <> struct use_kind<matrix_b> { enum { value = 1 }; };
template <class L> struct is_col;
template <> struct is_col<row_major> { enum { value = 0 }; };
template <> struct is_col<col_major> { enum { value = 1 }; };
} // namespace detail

// not a collective: every lane fills its own elements
template <class Use, int M, int N, int K, class T, class L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const T &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

template <class Use, class L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L> &f,
                             const __nv_bfloat16 *p, unsigned ldm,
                             const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    cuemu::WmmaReq r{};
    r.frag = f.x;
    r.ptr = const_cast<__nv_bfloat16 *>(p);
    r.ldm = ldm;
    r.col_major = detail::is_col<L>::value;
    r.kind = detail::use_kind<Use>::value;
    r.elem_bytes = 2;
    cuemu::warp_collective("wmma::load_matrix_sync", file, line, &r, cuemu::wmma_load);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t layout, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
    cuemu::WmmaReq r{};
    r.frag = f.x;
    r.ptr = const_cast<float *>(p);
    r.ldm = ldm;
    r.col_major = layout == mem_col_major;
    r.kind = 2;
    r.elem_bytes = 4;
    cuemu::warp_collective("wmma::load_matrix_sync", file, line, &r, cuemu::wmma_load);
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t layout, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    cuemu::WmmaReq r{};
    r.frag = const_cast<float *>(f.x);
    r.ptr = p;
    r.ldm = ldm;
    r.col_major = layout == mem_col_major;
    r.kind = 2;
    r.elem_bytes = 4;
    cuemu::warp_collective("wmma::store_matrix_sync", file, line, &r, cuemu::wmma_store);
}

template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c,
                     const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    cuemu::WmmaReq r{};
    r.frag = d.x;
    r.a = a.x;
    r.b = b.x;
    r.c = c.x;
    cuemu::warp_collective("wmma::mma_sync", file, line, &r, cuemu::wmma_mma);
}

} // namespace wmma
} // namespace nvcuda
