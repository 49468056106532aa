//! PURE: which partition a key belongs to, the way every Kafka client that uses the Java
//! producer's default does: `toPositive(murmur2(key)) % partitions`. geostate's producers
//! set librdkafka's `partitioner` to `murmur2_random`, the same function, so a key's
//! records land on one partition whether a Java, Go or Python producer, the gRPC API or a
//! shipping round wrote them.

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`): MurmurHash2, 32 bits,
/// seed `0x9747b28c`, read little-endian, as a signed int.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if let Some(&first) = tail.first() {
        h ^= u32::from(first);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `key` among `partitions` (at least 1), as the Java producer computes it.
pub fn partition_of(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed by the Java client (kafka-clients 4.1.1, `Utils.murmur2` and
    /// `Utils.toPositive(h) % n`): key, hash, partition of 4, partition of 12.
    const JAVA: [(&str, i32, i32, i32); 12] = [
        ("", 275646681, 1, 9),
        ("a", -1563381124, 0, 4),
        ("21", -973932308, 0, 0),
        ("foobar", -790332482, 2, 6),
        ("a-little-bit-long-string", -985981536, 0, 8),
        ("a-little-bit-longer-string", -1486304829, 3, 11),
        (
            "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            -58897971,
            1,
            5,
        ),
        ("requests/9q8yy", -1284121939, 1, 1),
        ("surge/9q8yy", -1967982423, 1, 5),
        ("drivers/u4pruyd", 594416608, 0, 4),
        ("requests/jepsen-7-1234-0", 734717093, 1, 5),
        ("zones/é", 348306081, 1, 9),
    ];

    #[test]
    fn keys_hash_and_partition_as_the_java_producer_does() {
        for (key, hash, of4, of12) in JAVA {
            assert_eq!(murmur2(key.as_bytes()), hash, "{key:?}");
            assert_eq!(partition_of(key.as_bytes(), 4), of4, "{key:?}");
            assert_eq!(partition_of(key.as_bytes(), 12), of12, "{key:?}");
        }
        assert_eq!(partition_of(b"anything", 0), 0);
    }
}
