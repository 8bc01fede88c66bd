#!/usr/bin/env bash
# tests/mutate_kernels.sh [BUILD] [FILTER]: mutation testing of the kernel tests. Each mutant
# below is one small change to one kernel source (eps removed, an off-by-one in a bound, a
# wrong mask value, a dropped scale, a missing barrier, ...), applied to a copy of kernels/,
# compiled under the CPU emulator and linked into test_kernels (exact host math), which then
# runs the cases of the kernel files involved (`test_kernels OP...`). Every mutant must be
# killed: the test fails, crashes or times out. A surviving mutant is a FAIL line naming it
# (a regime the tests do not reach). FILTER runs only the mutants whose id contains it.
#
# Brings $BUILD/tests/test_kernels up to date (make) first; MUTATE_JOBS mutants at a time
# (default 2, one emulator worker each). Part of `make test-slow` (kernels/kernels.mk). Time
# and last result: docs/results/2026-11-26-cpu.md (the table's history: tests/cuda_emu/README.md).
#
# Adding a mutant: `m ID FILE OPS FROM TO`, FROM a literal string (newlines allowed) that
# occurs exactly once in kernels/FILE, OPS the test_kernels groups to run. A mutant that
# survives because the test lacks inputs for its regime means: add the inputs to
# tests/cuda_emu/test_kernels.cpp, not delete the mutant. Only mutants that change
# behaviour belong here (an equivalent mutant cannot be killed).
set -u
shopt -u patsub_replacement 2>/dev/null   # '&' in a replacement is literal
build=${1:-build}
filter=${2:-}
jobs=${MUTATE_JOBS:-2}
cd "$(dirname "$0")/.."
. tests/lib.sh mutate_kernels

ids=() files=() ops=() froms=() tos=()
m() { ids+=("$1"); files+=("$2"); ops+=("$3"); froms+=("$4"); tos+=("$5"); }
NL=$'\n'

# ---------------------------------------------------------------- the mutants
# the control: no change, the same pipeline; it must pass (else every "killed" is suspect)
m control.unchanged rmsnorm.cu rmsnorm 'rsqrtf(ss / (float)C + eps)' 'rsqrtf(ss / (float)C + eps)'

m embedding.scan_includes_self embedding.cu embedding \
  'm < n; m += blockDim.x' 'm <= n; m += blockDim.x'
m embedding.gather_from_self embedding.cu embedding \
  'int m0 = n + 1;' 'int m0 = n;'
m embedding.tile_stride embedding.cu embedding \
  'm0 += EMB_THREADS) {' 'm0 += EMB_THREADS - 1) {'
m embedding.no_sync_tile_mask embedding.cu embedding \
  "__syncthreads();                                   // tile_mask is reused" ';'
m embedding.fwd_last_id embedding.cu embedding \
  'if (tok < 0 || tok >= V) {' 'if (tok < 0 || tok >= V - 1) {'
m embedding.bwd_last_id embedding.cu embedding \
  'if (tok < 0 || tok >= V) return;' 'if (tok < 0 || tok >= V - 1) return;'
m embedding.column_chunk embedding.cu embedding \
  'blockIdx.y * EMB_COLS + threadIdx.x * 8' 'blockIdx.y * (EMB_COLS - 8) + threadIdx.x * 8'
m embedding.f32_overwrites embedding.cu embedding \
  'for (int k = 0; k < ncols; k++) d[k] += acc[k];' 'for (int k = 0; k < ncols; k++) d[k] = acc[k];'

m rmsnorm.no_eps rmsnorm.cu rmsnorm \
  'rsqrtf(ss / (float)C + eps)' 'rsqrtf(ss / (float)C)'
m rmsnorm.mean_over_c_plus_1 rmsnorm.cu rmsnorm \
  'rsqrtf(ss / (float)C + eps)' 'rsqrtf(ss / (float)(C + 1) + eps)'
m rmsnorm.bwd_r_cubed rmsnorm.cu rmsnorm \
  'dot * r * r * r / (float)C' 'dot * r * r / (float)C'
m rmsnorm.scalar_no_weight rmsnorm.cu rmsnorm \
  'const bf16 q = f2bf(bf2f(weight[c]) * (bf2f(x[c]) * r));' 'const bf16 q = f2bf(bf2f(x[c]) * r);'
m rmsnorm.dw_last_chunk rmsnorm.cu rmsnorm \
  'k < nchunks; k++' 'k < nchunks - 1; k++'
m rmsnorm.dw_chunk_end rmsnorm.cu rmsnorm \
  'const int r1 = r0 + DW_CHUNK_ROWS < N ? r0 + DW_CHUNK_ROWS : N;' 'const int r1 = N;'
m rmsnorm.dw_f32_overwrites rmsnorm.cu rmsnorm \
  '((float *)dweight)[c] += s;' '((float *)dweight)[c] = s;'
m rmsnorm.dw_no_sync rmsnorm.cu rmsnorm \
  "acc[threadIdx.y][threadIdx.x] = s;$NL    __syncthreads();" 'acc[threadIdx.y][threadIdx.x] = s;'

m rope.bwd_sign_vec rope.cu rope 'float sk = sign * s[k];' 'float sk = s[k];'
m rope.scalar_sign rope.cu rope \
  'out[o_out + i + half] = f2bf(x2 * c + x1 * s);' 'out[o_out + i + half] = f2bf(x2 * c - x1 * s);'
m rope.batch_offset rope.cu rope \
  'const size_t row = b * T + t;' 'const size_t row = t;'
m rope.vec_width rope.cu rope 'int vec = (D / 2) % 8 == 0 &&' 'int vec = (D / 2) % 4 == 0 &&'
m rope.position rope.cu rope \
  'const int t = (int)(head_row / NH), h' 'const int t = (int)(head_row / NH) + (T > 1), h'
m rope.in_stride rope.cu rope \
  'o_in = row * ld_inp + (size_t)h * D' 'o_in = row * ld_out + (size_t)h * D'
m rope.qkv_k_offset rope.cu rope \
  'rope_launch(k, KVD, x + QD, W,' 'rope_launch(k, KVD, x + KVD, W,'
m rope.qkv_v_rotated rope.cu rope \
  'B, T, KVH, D, 1.0f, 0, seg, stream, op);' 'B, T, KVH, D, 1.0f, 1, seg, stream, op);'
m rope.qkv_bwd_v_offset rope.cu rope \
  'rope_launch(y + QD + KVD, W, dv,' 'rope_launch(y + QD, W, dv,'

m attention.causal_diag attention.cu attention \
  'if (tk <= tq && tq < T && tk >= seg_start' 'if (tk < tq && tq < T && tk >= seg_start'
m attention.mask_value attention.cu attention \
  "float s = -INFINITY;$NL            if (tk <= tq" "float s = 0.0f;$NL            if (tk <= tq"
m attention.no_running_max attention.cu attention \
  'for (int j = 0; j < ATT_BK; j++) mx = fmaxf(mx, row[j]);' 'for (int j = 0; j < ATT_BK; j++) mx = 0.0f;'
m attention.no_scale attention.cu attention \
  's = dot_smem(sQ + r * D, sK + j * (D + 1), D) * scale;' 's = dot_smem(sQ + r * D, sK + j * (D + 1), D);'
m attention.no_rescale attention.cu attention \
  'float a = acc[i] * sAlpha[r];' 'float a = acc[i];'
m attention.bwd_skips_diagonal attention.cu attention \
  'int q0 = k0 / ATT_BQ * ATT_BQ;' 'int q0 = k0 / ATT_BQ * ATT_BQ + ATT_BQ;'
m attention.bwd_dq_no_sync attention.cu attention \
  "        load_tile(sV, D + 1, v, b, k0, T, KVH, kh, D, vec);$NL        __syncthreads();" \
  "        load_tile(sV, D + 1, v, b, k0, T, KVH, kh, D, vec);"
m attention.delta attention.cu attention \
  's += bf2f(g[d]) * bf2f(o[d]);' 's += bf2f(g[d]) * bf2f(o[d]) * (d + 1 < D);'
m attention.tc_causal_diag attention.cu attention \
  's[e] = tk <= tq && tq < T && tk >= rseg ?' 's[e] = tk < tq && tq < T && tk >= rseg ?'
m attention.tc_no_rescale attention.cu attention \
  'o[ds][e] = o[ds][e] * alpha + wS' 'o[ds][e] = o[ds][e] + wS'
m attention.tc_no_running_max attention.cu attention \
  'mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));' 'mx = __shfl_xor_sync(0xffffffffu, 0.0f, 1);'

m attention.tc_no_sync_q attention.cu attention \
  "copy_tile_bf16(sQ, ld, q, ATT_TC_BQ, b, q0, T, H, h, D, vec);$NL    __syncthreads();" \
  'copy_tile_bf16(sQ, ld, q, ATT_TC_BQ, b, q0, T, H, h, D, vec);'
m attention.tc_sub_tile_k attention.cu attention \
  'wmma::load_matrix_sync(fk, sK + sub * ld + 16 * kk, ld);' 'wmma::load_matrix_sync(fk, sK + 16 * kk, ld);'
m attention.tc_sub_tile_v attention.cu attention \
  'wmma::load_matrix_sync(fv, sV + sub * ld + 16 * ds, ld);' 'wmma::load_matrix_sync(fv, sV + 16 * ds, ld);'
m attention.tc_sub_tile_mask attention.cu attention 'const int tk = kt + c0 + e;' 'const int tk = k0 + c0 + e;'

# the tensor-core backward (dK/dV + dS workspace kernel, dQ kernel)
m attention.tcb_no_sync_tile_end attention.cu attention \
  '__syncthreads();                         // previous query tile fully used' ';'
m attention.tcb_no_sync_tile_load attention.cu attention \
  "__syncthreads();$NL            if (wk0 >= T || wk0 > q0 + 15) continue;" \
  "if (wk0 >= T || wk0 > q0 + 15) continue;"
m attention.tcb_causal_diag attention.cu attention \
  'p[i][e] = tk <= tq && tq < T' 'p[i][e] = tk < tq && tq < T'
m attention.tcb_skips_diagonal attention.cu attention \
  'for (int q0 = k0; q0 < T; q0 += ATT_BW_BQ)' 'for (int q0 = k0 + ATT_BW_BQ; q0 < T; q0 += ATT_BW_BQ)'
m attention.tcb_last_query_row attention.cu attention \
  'for (int q0 = k0; q0 < T; q0 += ATT_BW_BQ)' 'for (int q0 = k0; q0 + 1 < T; q0 += ATT_BW_BQ)'
m attention.tcb_dq_causal_bound attention.cu attention \
  'if (tk0 > wq0) break;' 'if (tk0 >= wq0) break;'
m attention.tcb_no_delta attention.cu attention \
  '(wS[j * ATT_TC_LDS + c] - sDelta[c]) * scale;' 'wS[j * ATT_TC_LDS + c] * scale;'
m attention.tcb_ds_no_scale attention.cu attention \
  '(wS[j * ATT_TC_LDS + c] - sDelta[c]) * scale;' '(wS[j * ATT_TC_LDS + c] - sDelta[c]);'
m attention.tcb_s_no_scale attention.cu attention \
  '__expf(wS[j * ATT_TC_LDS + c] * scale - sLse[c])' '__expf(wS[j * ATT_TC_LDS + c] - sLse[c])'
m attention.tcb_gqa_first_head attention.cu attention \
  'const int h = kh * group + hl;' 'const int h = kh * group;'
m attention.tcb_chunk_head_offset attention.cu attention 'b0, kh0 * group,' 'b0, kh0,'
m attention.tcb_row_bound attention.cu attention 'if (t0 + r < T) {' 'if (t0 + r <= T) {'
m attention.tcb_dq_no_sync attention.cu attention \
  "copy_tile_bf16(sK, ld, k, ATT_DQ_BK, b, k0, T, KVH, kh, D, vec);$NL        __syncthreads();" \
  'copy_tile_bf16(sK, ld, k, ATT_DQ_BK, b, k0, T, KVH, kh, D, vec);'
m attention.tcb_dk_uses_p attention.cu attention \
  "wmma::load_matrix_sync(fa, wdS, ATT_TC_LDP);" "wmma::load_matrix_sync(fa, wP, ATT_TC_LDP);"

# segment starts (--pack_attention per_game): the position of RoPE, the key masks, the key
# ranges of the forward and dQ loops, the backward's early exits and skipped 16x16 blocks
m rope.seg_batch_row rope.cu rope \
  'const size_t pos = seg ? (size_t)(t - seg[row]) : (size_t)t;' 'const size_t pos = seg ? (size_t)(t - seg[t]) : (size_t)t;'
m rope.seg_ignored rope.cu rope \
  'const size_t pos = seg ? (size_t)(t - seg[row]) : (size_t)t;' 'const size_t pos = (size_t)t;'
m attention.seg_fwd_mask attention.cu attention \
  "tk >= seg_start(seg, b, T, tq))$NL                s = dot_smem" "tk + 1 >= seg_start(seg, b, T, tq))$NL                s = dot_smem"
m attention.seg_fwd_kbeg attention.cu attention \
  '/ ATT_BK * ATT_BK;   // the tile of the first row' '/ ATT_BK * ATT_BK + ATT_BK;   // the tile of the first row'
m attention.seg_dkdv_mask attention.cu attention \
  "sDelta[r],$NL                                tk <= tq && tq < T && tk >= seg_start" \
  "sDelta[r],$NL                                tk <= tq && tq < T && tk > seg_start"
m attention.seg_dkdv_break attention.cu attention \
  'if (seg_start(seg, b, T, q0) >= k0 + ATT_BK) break;' 'if (seg_start(seg, b, T, q0) > k0) break;'
m attention.seg_dq_mask attention.cu attention \
  "sDelta[r],$NL                            tk <= tq && tq < T && tk >= seg_start" \
  "sDelta[r],$NL                            tk <= tq && tq < T && tk > seg_start"
m attention.seg_dq_kbeg attention.cu attention \
  '/ ATT_BK * ATT_BK;   // as in the forward' '/ ATT_BK * ATT_BK + ATT_BK;   // as in the forward'
m attention.tc_seg_mask attention.cu attention 'tk <= tq && tq < T && tk >= rseg ?' 'tk <= tq && tq < T && tk >= wseg ?'
m attention.tc_seg_skip attention.cu attention 'if (kt + 15 < wseg) continue;' 'if (kt + 15 <= wseg) continue;'
m attention.tc_seg_kbeg attention.cu attention \
  '/ ATT_TC_BK * ATT_TC_BK;   // the round' '/ ATT_TC_BK * ATT_TC_BK + ATT_TC_BK;   // the round'
m attention.tcb_seg_mask attention.cu attention \
  'tk >= seg_start(seg, b, T, tq < T ? tq : 0)' 'tk > seg_start(seg, b, T, tq < T ? tq : 0)'
m attention.tcb_seg_break attention.cu attention \
  'if (qseg >= k0 + ATT_BW_BK) break;' 'if (qseg >= k0 + 16) break;'
m attention.tcb_seg_warp_skip attention.cu attention 'if (qseg > wk0 + 15) continue;' 'if (qseg > wk0) continue;'
m attention.tcb_seg_dq_skip attention.cu attention 'if (tk0 + 15 < wseg) continue;' 'if (tk0 + 15 <= wseg) continue;'
m attention.tcb_seg_dq_kbeg attention.cu attention \
  '/ ATT_DQ_BK * ATT_DQ_BK;   // the tile' '/ ATT_DQ_BK * ATT_DQ_BK + ATT_DQ_BK;   // the tile'

# lm_head: the fused softmax step between the backend's GEMMs (lmhead_xent_rows). The dx/dW
# GEMMs and the fp32 dW sum over chunks are host code (src/backend_cuda.c): test_backend_emu
# and test_cuda_emu_train's forced-chunk case cover them (no mutant of kernels/ reaches them).
# Not here: block_max without its trailing barrier (block_sum then reuses the scratch while a
# slow warp may still read the max). It survives: the emulator's warp collectives are
# rendezvous, and in none of its three orders does warp 0 pass ten of them before warp 1
# reads the scratch (tests/cuda_emu/README.md, "What it cannot catch"); a GPU run can.
m lmhead.mask_value lmhead_xent.cu lmhead_xent \
  'losses[r] = tgt == -100 ? 0.0f' 'losses[r] = tgt == -1 ? 0.0f'
m lmhead.last_id lmhead_xent.cu lmhead_xent \
  'if (tgt == -100 || tgt < 0 || tgt >= V) {' 'if (tgt == -100 || tgt < 0 || tgt >= V - 1) {'
m lmhead.no_max lmhead_xent.cu lmhead_xent \
  'm = block_max(m, scratch);' 'm = block_max(m, scratch) * 0.0f;'
m lmhead.lse_without_max lmhead_xent.cu lmhead_xent \
  'const float lse = m + logf(s);' 'const float lse = logf(s);'
m lmhead.onehot_sign lmhead_xent.cu lmhead_xent \
  '(j == tgt ? 1.0f : 0.0f)' '(j == tgt ? -1.0f : 0.0f)'
m lmhead.onehot_off_by_one lmhead_xent.cu lmhead_xent \
  '(j == tgt ? 1.0f : 0.0f)' '(j == tgt + 1 ? 1.0f : 0.0f)'
m lmhead.sum_without_max lmhead_xent.cu lmhead_xent \
  's += __expf(l[j] - m);' 's += __expf(l[j]);'
m lmhead.stride_no_sync lmhead_xent.cu lmhead_xent \
  '__syncthreads();                                   // the stride is read by everyone' ';'
m lmhead.stride_last_values lmhead_xent.cu lmhead_xent \
  'if (j < V) d[j] = f2bf(g[q]);' 'if (j < V - 1) d[j] = f2bf(g[q]);'
m lmhead.target_read_after_write lmhead_xent.cu lmhead_xent \
  "    if (threadIdx.x == 0) losses[r] = lse - l[tgt];$NL    if (backward) xent_write_dlogits(l, V, tgt, lse);" \
  "    if (backward) xent_write_dlogits(l, V, tgt, lse);$NL    if (threadIdx.x == 0) losses[r] = lse - l[tgt];"
m lmhead.masked_not_zeroed lmhead_xent.cu lmhead_xent \
  'for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = f2bf(0.0f);' \
  'for (int j = threadIdx.x; j < V - 1; j += blockDim.x) d[j] = f2bf(0.0f);'

m swiglu.sigmoid_overflow swiglu.cu swiglu \
  'return 1.0f / (1.0f + __expf(-g));' 'return __expf(g) / (1.0f + __expf(g));'
m swiglu.fwd_overflow swiglu.cu swiglu \
  'y[k] = g[k] / (1.0f + __expf(-g[k])) * u[k];' 'y[k] = g[k] * __expf(g[k]) / (1.0f + __expf(g[k])) * u[k];'
m swiglu.bwd_derivative swiglu.cu swiglu \
  '(1.0f + g[k] * (1.0f - s))' '(1.0f + g[k] * s)'
m swiglu.scalar_dup swiglu.cu swiglu 'dup[os] = f2bf(dy * (g * s));' 'dup[os] = f2bf(dy * g);'
m swiglu.row_stride swiglu.cu swiglu '*os = r * (size_t)ld + j;' '*os = r * (size_t)F + j;'
m swiglu.out_stride swiglu.cu swiglu '*oc = r * (size_t)F + j;' '*oc = r * (size_t)ld + j;'

m scale.no_alpha scale.cu scale 'out[i] = f2bf(alpha * bf2f(inp[i]));' 'out[i] = inp[i];'
m scale.first_skipped scale.cu scale 'i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;' \
  'i = (size_t)blockIdx.x * blockDim.x + threadIdx.x + 1; i < n;'

m accumulate.vec_no_alpha accumulate.cu accumulate 'd[k] += alpha * s[k];' 'd[k] += s[k];'
m accumulate.tail_overwrites accumulate.cu accumulate \
  'dst[i] += alpha * acc_load1(src + i);' 'dst[i] = alpha * acc_load1(src + i);'
m accumulate.f32_second_half accumulate.cu accumulate 'load4f(out + 4, p + 4);' 'load4f(out + 4, p);'
m accumulate.f32_as_bf16 accumulate.cu accumulate \
  'accumulate_f32_kernel)(
            dst, (const float *)src' 'accumulate_bf16_kernel)(
            dst, (const bf16 *)src'

m cast.second_half cast.cu cast 'load4f(v + 4, src + idx * 8 + 4);' 'load4f(v + 4, src + idx * 8);'
m cast.last_element cast.cu cast \
  'const size_t items = nvec + (n - nvec * 8);' 'const size_t items = nvec + (n - nvec * 8) - 1;'

m adamw.no_eps adamw.cu adamw \
  'float denom = sqrtf(v) / k.bc2_sqrt + k.eps;' 'float denom = sqrtf(v) / k.bc2_sqrt;'
m adamw.eps_inside_sqrt adamw.cu adamw \
  'float denom = sqrtf(v) / k.bc2_sqrt + k.eps;' 'float denom = sqrtf(v + k.eps) / k.bc2_sqrt;'
m adamw.no_weight_decay adamw.cu adamw 'float x = w * k.decay;' 'float x = w;'
m adamw.bc2_not_sqrt adamw.cu adamw \
  'k.bc2_sqrt = sqrtf(p->bias_correction2);' 'k.bc2_sqrt = p->bias_correction2;'
m adamw.no_grad_scale adamw.cu adamw 'g *= k.grad_scale;' 'g *= 1.0f;'
m adamw.param_order adamw.cu adamw \
  'p[1] = __floats2bfloat162_rn(w[2], w[3]);' 'p[1] = __floats2bfloat162_rn(w[3], w[2]);'
m adamw.bf16_moment_nearest adamw.cu adamw \
  'ft_f32_to_bf16_sr(__float_as_uint(x), ft_sr_bits(key, gi));' '__bfloat16_as_ushort(f2bf(x));'
m adamw.bf16_moment_pair_order adamw.cu adamw \
  'u.y = (uint32_t)b[2] | ((uint32_t)b[3] << 16);' 'u.y = (uint32_t)b[3] | ((uint32_t)b[2] << 16);'
m adamw.bf16_sr_same_stream adamw.cu adamw \
  'k.key_v = ft_sr_key(p->seed, p->step, 1);' 'k.key_v = ft_sr_key(p->seed, p->step, 0);'
m adamw.bf16_sr_no_offset adamw.cu adamw \
  'store4m(m + i, mm, k.key_m, k.offset + i);' 'store4m(m + i, mm, k.key_m, i);'
m adamw.bf16_sr_group_index adamw.cu adamw \
  'ft_sr_bits(key, gi + j)' 'ft_sr_bits(key, gi)'

m sum_squares.float_product sum_squares.cuh "sum_squares sum_squares_accumulate" \
  's += (double)v[k] * v[k];' 's += (double)(v[k] * v[k]);'
m sum_squares.tail_group sum_squares.cuh "sum_squares sum_squares_accumulate" \
  'const size_t ngroups = (n + 3) / 4;' 'const size_t ngroups = n / 4;'
m sum_squares.last_warp sum_squares.cuh "sum_squares sum_squares_accumulate" \
  'for (int w = 0; w < nwarps; w++)' 'for (int w = 0; w < nwarps - 1; w++)'
m sum_squares.no_sync sum_squares.cuh "sum_squares sum_squares_accumulate" \
  "if (lane == 0) scratch[warp] = v;$NL    __syncthreads();$NL    double t" \
  "if (lane == 0) scratch[warp] = v;$NL    double t"
m sum_squares.last_partial sum_squares.cuh "sum_squares sum_squares_accumulate" \
  'for (int i = threadIdx.x; i < G; i += blockDim.x)' 'for (int i = threadIdx.x; i < G - 1; i += blockDim.x)'
m sum_squares_accumulate.overwrites sum_squares.cuh sum_squares_accumulate \
  'if (threadIdx.x == 0) *out = add ? *out + s : s;' 'if (threadIdx.x == 0) *out = s;'
m sum_squares_accumulate.not_added sum_squares_accumulate.cu sum_squares_accumulate \
  'return ss_launch(acc, 1, x, n, stream' 'return ss_launch(acc, 0, x, n, stream'

m loss_accumulate.ignored_added loss_accumulate.cu loss_accumulate \
  'tile[j] = valid ? (double)losses[i] : 0.0;' 'tile[j] = i < N ? (double)losses[i] : 0.0;'
m loss_accumulate.overwrites loss_accumulate.cu loss_accumulate 'acc[0] += s;' 'acc[0] = s;'
m loss_accumulate.no_sync_tile loss_accumulate.cu loss_accumulate \
  '__syncthreads();   // the tile is rewritten next' ';'
m loss_accumulate.last_tile_row loss_accumulate.cu loss_accumulate \
  'const int n = N - base < LA_TILE ? N - base : LA_TILE;' 'const int n = N - base < LA_TILE ? N - base - 1 : LA_TILE;'
m loss_accumulate.count_all_rows loss_accumulate.cu loss_accumulate 'count += valid;' 'count += i < N;'

# FP8 quantisation (--fp8): the max of |x| (a negative extreme), each format's largest value,
# the amax = 0 guard (all-zero case), saturation (the infinity cases), the transposed index,
# the transposing tiles' edges (rows % 4 != 0: byte stores cut at the last row; 32-bit stores
# only when rows % 4 == 0) and their barrier, fp8_cast's given amax
m fp8_quantize.amax_signed fp8_quantize.cu fp8_quantize \
  'm = fmaxf(m, fabsf(bf2f(x[i])));' 'm = fmaxf(m, bf2f(x[i]));'
m fp8_quantize.e5m2_max fp8_quantize.cu fp8_quantize 'fmt == 1 ? 57344.0f : 448.0f' 'fmt == 1 ? 448.0f : 448.0f'
m fp8_quantize.zero_amax fp8_quantize.cu fp8_quantize 'm > 0.0f && isfinite(m) ?' 'isfinite(m) ?'
m fp8_quantize.no_saturation fp8_quantize.cu fp8_quantize '__NV_SATFINITE' '__NV_NOSAT'
m fp8_quantize.transpose_index fp8_quantize.cu fp8_quantize \
  'out_t + (size_t)cj * rows + rw;' 'out_t + (size_t)cj * cols + rw;'
m fp8_quantize.tile_edge_bytes fp8_quantize.cu fp8_quantize \
  'for (int b = 0; b < 4 && rw + b < rows; b++)' 'for (int b = 0; b < 4; b++)'
m fp8_quantize.tile_words_rows_even fp8_quantize.cu fp8_quantize \
  'const int words = rows % 4 == 0 &&' 'const int words = rows % 2 == 0 &&'
m fp8_quantize.tile_no_sync fp8_quantize.cu fp8_quantize \
  "__syncthreads();$NL        const int rw" 'const int rw'
m fp8_quantize.cast_no_amax fp8_quantize.cu fp8_quantize \
  'scale_and_cast(out, out_t, stats, amax, 1, inp' 'scale_and_cast(out, out_t, stats, amax, 0, inp'

# --fp8's fused amax (rmsnorm_fwd, swiglu_fwd: test_kernels' fp8_amax group): the max of the
# stored (rounded) values, of their magnitudes, published at all, the slot zeroed first, and
# joined by atomicMax (a plain store: the last block's max)
m rmsnorm.amax_unrounded rmsnorm.cu fp8_amax \
  'm = fmaxf(m, fabsf(bf2f(f2bf(v[k]))));' 'm = fmaxf(m, fabsf(v[k]));'
m rmsnorm.amax_scalar_signed rmsnorm.cu fp8_amax 'm = fmaxf(m, fabsf(bf2f(q)));' 'm = fmaxf(m, bf2f(q));'
m swiglu.amax_unrounded swiglu.cu fp8_amax \
  'm = fmaxf(m, fabsf(bf2f(f2bf(y[k]))));' 'm = fmaxf(m, fabsf(y[k]));'
m swiglu.amax_not_published swiglu.cu fp8_amax 'if (amax) block_amax_publish(amax, m, scratch);' ';'
m common.amax_not_zeroed common.cuh "rmsnorm swiglu fp8_amax" \
  'return amax ? cuda_check(cudaMemsetAsync(' 'return 0 ? cuda_check(cudaMemsetAsync('
m common.amax_stored common.cuh "rmsnorm swiglu fp8_amax" \
  'atomicMax(reinterpret_cast<int *>(amax), __float_as_int(m));' '*amax = m;'

# shared helpers (kernels/common.cuh): the files of the groups named are rebuilt
m common.block_sum_no_sync common.cuh "rmsnorm lmhead_xent" \
  "if (lane == 0) scratch[warp] = v;$NL    __syncthreads();$NL    float t" \
  "if (lane == 0) scratch[warp] = v;$NL    float t"
m common.warp_max_half common.cuh lmhead_xent \
  'for (int o = 16; o > 0; o >>= 1) v = fmaxf(' 'for (int o = 8; o > 0; o >>= 1) v = fmaxf('
m common.bf16_truncates common.cuh "cast scale" \
  'return __float2bfloat16_rn(x);' 'return __float2bfloat16_rz(x);'

# ---------------------------------------------------------------- running them
if [ ! -x "$build/tests/test_kernels" ]; then
  if [ "${CI:-}" = true ]; then bad "$build/tests/test_kernels not built (make test-bins)"
  else echo "skip: $build/tests/test_kernels not built (needs the CUDA headers; make test-bins)"; fi
  finish
fi
tmp=$(mktemp -d /tmp/ft-mutants.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# the objects the mutants link with must match the sources (a stale test_kernels.o against a
# newer libfinetune.a crashes every mutant); stderr apart: a make running this script may
# pass jobserver warnings along
make --no-print-directory BUILD="$build" "$build/tests/test_kernels" >"$tmp/make.log" 2>&1 \
  || { bad "make $build/tests/test_kernels: $(grep -m1 -i error "$tmp/make.log")"; finish; }
vars=$(make --no-print-directory BUILD="$build" kernel-emu-vars 2>"$tmp/vars.err") \
  || { bad "make kernel-emu-vars: $(tail -1 "$tmp/vars.err")"; finish; }
eval "$vars"
export CUEMU_WORKERS=1


# run_mutant I: writes $tmp/I.result ("killed ..." / "SURVIVED ..." / "INVALID ...")
run_mutant() {
  local i=$1 d=$tmp/$1 file=${files[$1]} from=${froms[$1]} to=${tos[$1]} src rest rebuild objs o f
  mkdir -p "$d/k"
  cp kernels/* "$d/k/"
  src=$(<"kernels/$file")
  rest=${src#*"$from"}
  if [ "$rest" = "$src" ]; then echo "INVALID: text not found in kernels/$file" >"$d.result"; return; fi
  if [[ $rest == *"$from"* ]]; then echo "INVALID: text occurs more than once in kernels/$file" >"$d.result"; return; fi
  printf '%s\n' "${src/"$from"/"$to"}" >"$d/k/$file"
  case $file in
    *.cu) rebuild=${file%.cu} ;;
    *) rebuild=${ops[$i]} ;;
  esac
  objs=""
  for o in $KERNEL_OBJS; do
    f=$(basename "$o" .o)
    if [[ " $rebuild " == *" $f "* ]]; then
      # shellcheck disable=SC2086
      $CXX $KERNEL_CXXFLAGS -I"$d/k" -x c++ -c "$d/k/$f.cu" -o "$d/$f.o" >"$d/build.log" 2>&1 \
        || { echo "INVALID: does not compile: $(grep -m1 error "$d/build.log")" >"$d.result"; return; }
      o=$d/$f.o
    fi
    objs+=" $o"
  done
  # shellcheck disable=SC2086
  $CXX $TEST_OBJS $objs -o "$d/test_kernels" $LINK_LIBS >"$d/link.log" 2>&1 \
    || { echo "INVALID: does not link: $(grep -m1 -i error "$d/link.log")" >"$d.result"; return; }
  # shellcheck disable=SC2086
  (timeout 300 "$d/test_kernels" ${ops[$i]} >"$d/run.log" 2>&1) 2>/dev/null   # (no "Segmentation fault" line)
  local rc=$? summary
  summary=$(grep -E '^test_kernels: [0-9]+ passed' "$d/run.log" | tail -1)
  if [ $rc -eq 0 ]; then echo "SURVIVED: test_kernels ${ops[$i]}: $summary" >"$d.result"
  elif [ $rc -eq 124 ]; then echo "killed (timed out)" >"$d.result"
  elif [ -n "$summary" ]; then echo "killed (${summary#test_kernels: })" >"$d.result"
  else echo "killed (exit $rc: $(tail -1 "$d/run.log"))" >"$d.result"; fi
  rm -rf "$d"
}

start=$(date +%s)
sel=() used=""
for i in "${!ids[@]}"; do
  [[ ${ids[$i]} == *"$filter"* ]] || continue
  sel+=("$i")
  for o in ${ops[$i]}; do [[ " $used " == *" $o "* ]] || used+=" $o"; done
done
[ ${#sel[@]} -gt 0 ] || { bad "no mutant id contains '$filter'"; finish; }
# the unchanged tests of those ops must pass, or every mutant would look killed
# shellcheck disable=SC2086
if ! out=$(CUEMU_WORKERS=2 "$build/tests/test_kernels" $used 2>&1); then
  bad "the unmutated test_kernels$used fails: $(tail -1 <<<"$out")"; finish
fi
running=0
for i in "${sel[@]}"; do
  run_mutant "$i" &
  running=$((running + 1))
  if [ $running -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait
for i in "${sel[@]}"; do
  r=$(cat "$tmp/$i.result" 2>/dev/null || echo "INVALID: no result")
  if [ "${froms[$i]}" = "${tos[$i]}" ]; then
    case $r in
      SURVIVED*) ok "${ids[$i]}: the unchanged source passes through the same build and run" ;;
      *) bad "${ids[$i]}: the unchanged source fails through the mutant pipeline, so every 'killed' is suspect: $r" ;;
    esac
    continue
  fi
  case $r in
    killed*) ok "${ids[$i]}: $r" ;;
    *) bad "${ids[$i]} (kernels/${files[$i]}: '${froms[$i]}' -> '${tos[$i]}'): $r" ;;
  esac
done
echo "mutate_kernels: ${#sel[@]} builds (mutants and the control) in $(( $(date +%s) - start )) s with $jobs jobs"
finish
