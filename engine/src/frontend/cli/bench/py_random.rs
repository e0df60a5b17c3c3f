//! CPython's `random` module, as far as `minisgl bench` needs it: the
//! MT19937 generator seeded the way `random.seed(n)` seeds it for an integer
//! `n`, and `getrandbits`, `randrange`/`randint` on top.
//!
//! It exists for byte-for-byte compatibility with mini-sglang's
//! `benchmark/offline/bench.py`, which draws its prompts and output lengths
//! with `random.seed(0)` and `randint`: with the same draws, a throughput
//! figure of `minisgl bench` compares with mini-sglang's on the same workload.
//! Nothing else should use it; `rand` is the crate's generator.
//!
//! References (CPython 3.11): `Modules/_randommodule.c` (`init_genrand`,
//! `init_by_array`, `genrand_uint32`, `random_seed`,
//! `_random_Random_getrandbits_impl`) and `Lib/random.py` (`randint`,
//! `randrange`, `_randbelow_with_getrandbits`).

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// CPython's `random.Random`: the MT19937 state and the draws built on it.
#[derive(Clone)]
pub struct PyRandom {
    state: [u32; N],
    /// Next word of `state` to temper; `N` means the state must be regenerated.
    index: usize,
}

impl PyRandom {
    /// `random.seed(seed)` for an integer: the key is `abs(seed)` split into
    /// 32-bit words, least significant first, at least one word (so 0 is `[0]`).
    pub fn seed(seed: u64) -> Self {
        let (low, high) = (seed as u32, (seed >> 32) as u32);
        if high == 0 {
            Self::from_key(&[low])
        } else {
            Self::from_key(&[low, high])
        }
    }

    /// The generator after `init_by_array(key)`.
    pub fn from_key(key: &[u32]) -> Self {
        let mut state = [0u32; N];
        state[0] = 19_650_218;
        for i in 1..N {
            state[i] = 1_812_433_253u32.wrapping_mul(state[i - 1] ^ (state[i - 1] >> 30)).wrapping_add(i as u32);
        }
        let key_len = key.len().max(1);
        let key_at = |j: usize| key.get(j).copied().unwrap_or(0);
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key_len) {
            let prev = state[i - 1] ^ (state[i - 1] >> 30);
            state[i] = (state[i] ^ prev.wrapping_mul(1_664_525)).wrapping_add(key_at(j)).wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                state[0] = state[N - 1];
                i = 1;
            }
            if j >= key_len {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = state[i - 1] ^ (state[i - 1] >> 30);
            state[i] = (state[i] ^ prev.wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                state[0] = state[N - 1];
                i = 1;
            }
        }
        // Assures a non-zero initial state.
        state[0] = 0x8000_0000;
        Self { state, index: N }
    }

    /// The next 32 random bits (`genrand_uint32`).
    pub fn genrand_uint32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn twist(&mut self) {
        let mag01 = |y: u32| if y & 1 == 0 { 0 } else { MATRIX_A };
        for kk in 0..N {
            let y = (self.state[kk] & UPPER_MASK) | (self.state[(kk + 1) % N] & LOWER_MASK);
            self.state[kk] = self.state[(kk + M) % N] ^ (y >> 1) ^ mag01(y);
        }
        self.index = 0;
    }

    /// `getrandbits(k)` for any `k`, as 32-bit words, least significant first:
    /// one draw per word, the last (most significant) one shifted down to the
    /// bits that remain. `k == 0` draws nothing.
    pub fn getrandbits_words(&mut self, k: usize) -> Vec<u32> {
        let mut words = Vec::with_capacity(k.div_ceil(32));
        let mut left = k;
        while left > 0 {
            let r = self.genrand_uint32();
            words.push(if left < 32 { r >> (32 - left) } else { r });
            left = left.saturating_sub(32);
        }
        words
    }

    /// `getrandbits(k)` for `k <= 128`.
    pub fn getrandbits(&mut self, k: u32) -> u128 {
        assert!(k <= 128, "getrandbits: {k} bits do not fit a u128");
        self.getrandbits_words(k as usize).iter().rev().fold(0u128, |acc, &w| (acc << 32) | u128::from(w))
    }

    /// `_randbelow(n)`: a uniform integer in `[0, n)`, by rejection of
    /// `getrandbits(n.bit_length())` draws that reach `n`.
    pub fn randbelow(&mut self, n: u128) -> u128 {
        assert!(n > 0, "randbelow: empty range");
        let k = 128 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `randint(a, b)`: a uniform integer in `[a, b]`, both ends included
    /// (`randrange(a, b + 1)`, i.e. `a + _randbelow(b - a + 1)`).
    pub fn randint(&mut self, a: u64, b: u64) -> u64 {
        assert!(a <= b, "randint: empty range [{a}, {b}]");
        a + self.randbelow(u128::from(b - a) + 1) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values printed by CPython 3.11.7:
    /// `random.seed(s); [getrandbits(32) for _ in range(3)], getrandbits(1),
    /// getrandbits(40), getrandbits(64), hex(getrandbits(100)),
    /// randint(0, 2**40), randint(5, 5), randrange(1000)`.
    /// `(seed, 3 x getrandbits(32), getrandbits(1), getrandbits(40),
    /// getrandbits(64), getrandbits(100), randint(0, 2**40), randint(5, 5),
    /// randrange(1000))`.
    type Case = (u64, [u32; 3], u128, u128, u128, u128, u64, u64, u128);

    #[test]
    fn matches_cpython() {
        #[rustfmt::skip]
        let cases: &[Case] = &[
            (0, [3626764237, 1654615998, 3255389356], 1, 44756014165, 17809683713383489082, 0xe67a9c3787c65c1e582e2e662, 788025983492, 5, 516),
            (1, [577090037, 2444712010, 3639700191], 1, 71999863748, 2175216119781798972, 0x77311d8a3c2ce6f447ed4d57b, 836022225947, 5, 96),
            (12345, [1789368711, 3146859322, 43676229], 1, 884012530637, 15774518201988393282, 0x43193ca54ee8971105e503a67, 960208693573, 5, 382),
            (1 << 32, [485306839, 1508871100, 1794561286], 1, 21546460955, 16161065642225157897, 0xd54ddeae1c3284361ce3ee200, 32005304388, 5, 77),
            ((1 << 40) + 7, [2635837658, 3209733218, 3500038837], 1, 704138462757, 13015927955237707764, 0x9f2b8dced4037578679d6296a, 797660323531, 5, 453),
            (u64::MAX, [93740670, 1068495656, 1452108352], 1, 499126599761, 1752763915482752451, 0xc5efcc0ebe69b9bc6eb6900f4, 119153246635, 5, 747),
        ];
        for &(seed, words, bit1, bits40, bits64, bits100, randint40, randint5, randrange) in cases {
            let mut r = PyRandom::seed(seed);
            let got = [r.genrand_uint32(), r.genrand_uint32(), r.genrand_uint32()];
            assert_eq!(got, words, "seed {seed}: genrand_uint32");
            assert_eq!(r.getrandbits(1), bit1, "seed {seed}: getrandbits(1)");
            assert_eq!(r.getrandbits(40), bits40, "seed {seed}: getrandbits(40)");
            assert_eq!(r.getrandbits(64), bits64, "seed {seed}: getrandbits(64)");
            assert_eq!(r.getrandbits(100), bits100, "seed {seed}: getrandbits(100)");
            assert_eq!(r.randint(0, 1 << 40), randint40, "seed {seed}: randint(0, 2**40)");
            assert_eq!(r.randint(5, 5), randint5, "seed {seed}: randint(5, 5)");
            assert_eq!(r.randbelow(1000), randrange, "seed {seed}: randrange(1000)");
        }
    }

    #[test]
    fn getrandbits_zero_draws_nothing() {
        let mut a = PyRandom::seed(0);
        let mut b = PyRandom::seed(0);
        assert!(a.getrandbits_words(0).is_empty());
        assert_eq!(a.genrand_uint32(), b.genrand_uint32());
    }
}
