// rng.h: the one random number generator of src/ (data order, sampling): splitmix64, a tiny
// well-mixed generator whose whole state is one uint64_t, so a stream is a pure function of
// its seed (resumed runs and every rank draw the same numbers).
#pragma once
#include <stdint.h>

// Next 64 random bits; advances *state.
static inline uint64_t rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform double in [0, 1) from the top 53 bits.
static inline double rng_uniform(uint64_t *state) { return (double)(rng_next(state) >> 11) / 9007199254740992.0; }
