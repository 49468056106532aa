//! One pre-loaded input topic per dataset: keys, Zipf or uniform, about 80-byte JSON events.

use super::*;

/// One pre-loaded input topic.
pub(crate) struct Dataset {
    pub(crate) name: String,
    pub(crate) keys: usize,
    pub(crate) topic: Topics,
    /// The records as produced, for the in-memory ceilings.
    pub(crate) records: Vec<(String, Vec<u8>)>,
}

impl Dataset {
    pub(crate) fn generate(keys: usize, zipf: bool, topic: Topics) -> Self {
        let dist = zipf.then(|| Zipf::new(keys, 0.99));
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ keys as u64 ^ zipf as u64);
        let records = (0..EVENTS)
            .map(|i| {
                let k = match &dist {
                    Some(z) => z.sample(rng.unit()),
                    None => rng.below(keys as u64) as usize,
                };
                // requests are rider counts (g_counter), drivers come and go (pn_counter)
                let (ns, add) = if i % 2 == 0 {
                    ("requests", 1)
                } else {
                    ("drivers", rng.below(3) as i64 - 1)
                };
                let key = format!("{ns}/sf/{}/cell-{k:07}", geohash(k % 32_768));
                let payload = format!(
                    r#"{{"key":"{key}","add":{add},"event_time":{}}}"#,
                    1_700_000_000_000u64 + i as u64
                );
                (key, payload.into_bytes())
            })
            .collect();
        let name = format!(
            "{} keys, {}",
            if keys >= 1_000_000 { "1M" } else { "10k" },
            if zipf { "Zipf 0.99" } else { "uniform" }
        );
        Self {
            name,
            keys,
            topic,
            records,
        }
    }

    pub(crate) fn mean_bytes(&self) -> f64 {
        self.records.iter().map(|(_, p)| p.len()).sum::<usize>() as f64 / EVENTS as f64
    }
}
