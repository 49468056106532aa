//! Load generation shared by the surge-pricing demo (`src/bin/surge.rs`), the benchmarks,
//! the Jepsen harness and the drills: a Zipf key choice, a deterministic generator (a
//! seed replays a run), geohash cells.

/// Zipf(s) over `n` ranks by inverse CDF.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Self {
        let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(s)).collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        Self { cdf }
    }
    /// The rank (0 = most frequent) for a uniform `u` in [0, 1).
    pub fn sample(&self, u: f64) -> usize {
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// xorshift64: small, deterministic, good enough for load generation.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in `0..n` (modulo bias is fine for load generation).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The `i`-th geohash cell of a 6-character grid inside San Francisco's `9q8`.
pub fn geohash(i: usize) -> String {
    const BASE32: &[u8] = b"0123456789bcdefghjkmnpqrstuvwxyz";
    let mut s = String::from("9q8");
    let mut x = i;
    for _ in 0..3 {
        s.push(BASE32[x % 32] as char);
        x /= 32;
    }
    s
}
