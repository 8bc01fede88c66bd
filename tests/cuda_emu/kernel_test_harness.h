// kernel_test_harness.h: the case driver of tests/cuda_emu/test_kernels.cpp (its only
// includer, one translation unit with test.h's counters): seeded bf16-rounded inputs,
// "device" buffers with sentinel guards, outputs read back as fp32 with their raw bits, NMSE
// against a reference, and run_case, which runs one case in the emulator's three thread
// orders and checks results, guards and bitwise determinism (the rules are in
// test_kernels.cpp's header). Needs: kernels.h, common.h, test.h and the THR_* thresholds.
#pragma once

static const int ORDERS[3] = {CUEMU_FORWARD, CUEMU_REVERSE, CUEMU_RANDOM};
static const backend *CPU;

// ----------------------------------------------------------------------------
// random inputs

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static uint32_t rng_u32() { return test_rand_u32(&g_rng); }
static float rng_normal() { return test_rand_normal(&g_rng); }
static float bfround(float x) { return ft_bf16_to_f32(ft_f32_to_bf16(x)); }
// bf16-representable normal values (what both sides see)
static std::vector<float> randn_bf(size_t n, float scale) {
    std::vector<float> v(n);
    for (auto &x : v) x = bfround(scale * rng_normal());
    return v;
}
static std::vector<float> randn_f(size_t n, float scale) {
    std::vector<float> v(n);
    for (auto &x : v) x = scale * rng_normal();
    return v;
}

// ----------------------------------------------------------------------------
// "device" buffers with sentinel guards

#define GUARD 256
// 0x7f7f7f7f is a huge float (3.4e38) and bf16 0x7f7f too: reading a guard shows up as well
static const unsigned char GUARD_BYTE = 0x7f;

struct Dev {
    struct Buf { unsigned char *base; size_t total; unsigned char *ptr; size_t bytes; };
    std::vector<Buf> bufs;
    ~Dev() { for (auto &b : bufs) free(b.base); }
    // `misalign` bytes after a 256-aligned address (0 = aligned, as cudaMalloc)
    void *alloc(size_t bytes, size_t misalign = 0) {
        size_t total = GUARD + misalign + bytes + GUARD;
        void *p = nullptr;
        if (posix_memalign(&p, 256, total) != 0) abort();
        unsigned char *base = (unsigned char *)p;
        memset(base, GUARD_BYTE, total);
        unsigned char *ptr = base + GUARD + misalign;
        memset(ptr, 0xff, bytes);                         // poison
        bufs.push_back({base, total, ptr, bytes});
        return ptr;
    }
    bool guards_ok() const {
        for (auto &b : bufs) {
            for (unsigned char *q = b.base; q < b.ptr; q++) if (*q != GUARD_BYTE) return false;
            for (unsigned char *q = b.ptr + b.bytes; q < b.base + b.total; q++)
                if (*q != GUARD_BYTE) return false;
        }
        return true;
    }
    void *bf16(const std::vector<float> &v, size_t misalign = 0) {
        uint16_t *p = (uint16_t *)alloc(v.size() * 2, misalign);
        for (size_t i = 0; i < v.size(); i++) p[i] = ft_f32_to_bf16(v[i]);
        return p;
    }
    float *f32(const std::vector<float> &v, size_t misalign = 0) {
        float *p = (float *)alloc(v.size() * 4, misalign);
        if (!v.empty()) memcpy(p, v.data(), v.size() * 4);
        return p;
    }
    int32_t *i32(const std::vector<int32_t> &v) {
        int32_t *p = (int32_t *)alloc(v.size() * 4);
        if (!v.empty()) memcpy(p, v.data(), v.size() * 4);
        return p;
    }
};

// one output of one run: its fp32 values and its raw bytes
struct Output {
    std::vector<float> vals;
    std::vector<unsigned char> raw;
};
static Output read_bf16(const void *p, size_t n) {
    Output o;
    o.vals.resize(n);
    o.raw.assign((const unsigned char *)p, (const unsigned char *)p + n * 2);
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, (const unsigned char *)p + 2 * i, 2);
        o.vals[i] = ft_bf16_to_f32(h);
    }
    return o;
}
static Output read_f32(const float *p, size_t n) {
    Output o;
    o.vals.assign(p, p + n);
    o.raw.assign((const unsigned char *)p, (const unsigned char *)p + n * 4);
    return o;
}

struct Run {
    int rc = 0;
    bool guards = true;
    std::vector<Output> outs;
};

enum { M_NMSE, M_BITS, M_F64, M_RMS };
struct Ref {
    const char *name;
    std::vector<float> vals;        // M_NMSE: the reference values
    double thr;
    int metric = M_NMSE;
    std::vector<unsigned char> bits;  // M_BITS: expected bf16 bit patterns (metric = #differing)
    double d = 0;                   // M_F64: expected double (metric = relative error^2)
};
static Ref nmse_ref(const char *name, const std::vector<float> &v, double thr) {
    Ref r;
    r.name = name; r.vals = v; r.thr = thr;
    return r;
}
static double metric(const Ref &ref, const Output &o) {
    if (ref.metric == M_RMS) {   // absolute: sqrt(mean((out - ref)^2))
        if (o.vals.size() != ref.vals.size() || o.vals.empty()) return INFINITY;
        double s = 0;
        for (size_t i = 0; i < o.vals.size(); i++) {
            double d = (double)o.vals[i] - ref.vals[i];
            s += d * d;
        }
        return isfinite(s) ? sqrt(s / o.vals.size()) : INFINITY;
    }
    if (ref.metric == M_NMSE) {
        if (o.vals.size() != ref.vals.size()) return INFINITY;
        return test_nmse(o.vals.data(), ref.vals.data(), ref.vals.size());
    }
    if (ref.metric == M_BITS) {
        if (o.raw.size() != ref.bits.size()) return INFINITY;
        double bad = 0;
        for (size_t i = 0; i + 1 < o.raw.size(); i += 2) {
            unsigned a = o.raw[i] | o.raw[i + 1] << 8, b = ref.bits[i] | ref.bits[i + 1] << 8;
            bool nan_a = (a & 0x7fff) > 0x7f80, nan_b = (b & 0x7fff) > 0x7f80;
            bad += nan_a != nan_b || (!nan_a && a != b);
        }
        return bad;
    }
    double got;
    if (o.raw.size() != sizeof got) return INFINITY;
    memcpy(&got, o.raw.data(), sizeof got);
    double rel = ref.d != 0 ? (got - ref.d) / ref.d : got;
    return isfinite(rel) ? rel * rel : INFINITY;
}

// ----------------------------------------------------------------------------
// the driver

static double g_worst_ratio = 0;   // worst NMSE / threshold (for the summary)

static void run_case(const char *op, const std::string &shape, const std::vector<Ref> &refs,
                     const std::function<void(Run &)> &fn) {
    std::vector<double> worst(refs.size(), 0.0);
    std::vector<Output> first;
    bool rc_ok = true, guards_ok = true, same_bits = true, count_ok = true;
    std::string err;
    for (int o = 0; o < 3; o++) {
        cuemu_set_order(ORDERS[o], 1234567 + o);
        ft_error_clear();
        Run r;
        fn(r);
        if (r.rc != 0) {
            rc_ok = false;
            err = ft_error_message();
        }
        guards_ok &= r.guards;
        if (r.outs.size() != refs.size()) { count_ok = false; continue; }
        for (size_t k = 0; k < refs.size(); k++) {
            double e = metric(refs[k], r.outs[k]);
            if (!(e <= worst[k])) worst[k] = e;   // NaN/inf stick
            if (o == 0) continue;
            if (r.outs[k].raw != first[k].raw) same_bits = false;
        }
        if (o == 0) first = r.outs;
    }
    for (size_t k = 0; k < refs.size(); k++) {
        bool ok = rc_ok && guards_ok && same_bits && count_ok && worst[k] <= refs[k].thr;
        if (refs[k].thr > 0 && worst[k] / refs[k].thr > g_worst_ratio) g_worst_ratio = worst[k] / refs[k].thr;
        printf("%-16s %-40s %-8s %10.3e %9.1e  %s%s%s%s\n", op, shape.c_str(), refs[k].name,
               worst[k], refs[k].thr, ok ? "pass" : "FAIL", rc_ok ? "" : " (error)",
               guards_ok ? "" : " (guard overwritten)", same_bits ? "" : " (orders differ)");
        EXPECT(ok, "%s %s %s: nmse %.3e thr %.1e rc_ok %d guards %d same_bits %d %s", op,
               shape.c_str(), refs[k].name, worst[k], refs[k].thr, rc_ok, guards_ok, same_bits,
               err.c_str());
    }
    fflush(stdout);
}

static std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static std::string fmt(const char *f, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}
