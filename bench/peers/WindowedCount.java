// The Apache Flink peer of the windowed ingest benchmark (benches/windows.rs): counts the
// events per key of the benchmark topic in event-time windows, the way geostate's
// `[namespace.window]` does, and writes each window's count to an output topic.
//
//   - Kafka source (parallelism 1, the job on one task slot of a local MiniCluster), its
//     offsets committed to the consumer group APP_ID when a checkpoint completes: the
//     benchmark follows its progress through those offsets, as with Kafka Streams;
//   - event time from the record's `event_time` field, watermarks 5 s behind the largest
//     event time seen (geostate's `watermark.out-of-orderness`);
//   - tumbling windows (SLIDE = SIZE) or sliding ones, 10 s allowed lateness, counted with
//     an incremental aggregate into the RocksDB state backend (incremental checkpoints);
//   - exactly-once checkpoints every CHECKPOINT_MS to STATE_DIR, and a transactional Kafka
//     sink committed with them.
//
// The event time is read with a scan for `"event_time":` rather than a JSON parser, which
// is cheaper than what geostate does (serde_json of the whole record): it leans in the
// peer's favour. It runs until it is stopped.
//
//   java -cp 'libs/*:classes' WindowedCount BOOTSTRAP INPUT OUTPUT APP_ID SIZE_S SLIDE_S CHECKPOINT_MS STATE_DIR

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.api.java.tuple.Tuple3;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.windowing.ProcessWindowFunction;
import org.apache.flink.streaming.api.windowing.assigners.SlidingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.assigners.TumblingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.assigners.WindowAssigner;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.util.Collector;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;

public final class WindowedCount {
    public static void main(String[] args) throws Exception {
        if (args.length != 8) {
            System.err.println(
                    "usage: WindowedCount BOOTSTRAP INPUT OUTPUT APP_ID SIZE_S SLIDE_S CHECKPOINT_MS STATE_DIR");
            System.exit(2);
        }
        String bootstrap = args[0], input = args[1], output = args[2], app = args[3];
        Duration size = Duration.ofSeconds(Long.parseLong(args[4]));
        Duration slide = Duration.ofSeconds(Long.parseLong(args[5]));
        String stateDir = args[7];

        Configuration conf = Configuration.fromMap(Map.of(
                "state.backend.type", "rocksdb",
                "execution.checkpointing.incremental", "true",
                "execution.checkpointing.dir", "file://" + stateDir + "/checkpoints",
                "execution.checkpointing.interval", args[6] + " ms",
                "execution.checkpointing.mode", "EXACTLY_ONCE",
                "io.tmp.dirs", stateDir));
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(1);

        KafkaSource<Tuple2<String, Long>> source = KafkaSource.<Tuple2<String, Long>>builder()
                .setBootstrapServers(bootstrap)
                .setTopics(input)
                .setGroupId(app)
                .setStartingOffsets(OffsetsInitializer.earliest())
                .setDeserializer(new Events())
                .setProperty("commit.offsets.on.checkpoint", "true")
                .build();
        KafkaSink<Tuple3<String, Long, Long>> sink = KafkaSink.<Tuple3<String, Long, Long>>builder()
                .setBootstrapServers(bootstrap)
                .setRecordSerializer(new Counts(output))
                .setDeliveryGuarantee(DeliveryGuarantee.EXACTLY_ONCE)
                .setTransactionalIdPrefix(app)
                .setProperty("transaction.timeout.ms", "60000")
                .build();
        WindowAssigner<Object, TimeWindow> windows = size.equals(slide)
                ? TumblingEventTimeWindows.of(size)
                : SlidingEventTimeWindows.of(size, slide);

        env.fromSource(source,
                        WatermarkStrategy.<Tuple2<String, Long>>forBoundedOutOfOrderness(Duration.ofSeconds(5))
                                .withTimestampAssigner((event, kafkaTimestamp) -> event.f1),
                        "events")
                .keyBy(event -> event.f0, Types.STRING)
                .window(windows)
                .allowedLateness(Duration.ofSeconds(10))
                .aggregate(new Count(), new WithWindow(), Types.LONG, Types.LONG,
                        Types.TUPLE(Types.STRING, Types.LONG, Types.LONG))
                .sinkTo(sink);
        System.out.println("started " + app);
        env.execute(app);
    }

    /** (key, event time) of a record: its Kafka key and its JSON `event_time`. */
    static final class Events implements KafkaRecordDeserializationSchema<Tuple2<String, Long>> {
        private static final byte[] FIELD = "\"event_time\":".getBytes(StandardCharsets.UTF_8);

        @Override
        public void deserialize(ConsumerRecord<byte[], byte[]> record, Collector<Tuple2<String, Long>> out) {
            byte[] value = record.value();
            int at = indexOf(value, FIELD);
            if (record.key() == null || at < 0) {
                return; // not an event of the benchmark
            }
            long time = 0;
            for (int i = at + FIELD.length; i < value.length && value[i] >= '0' && value[i] <= '9'; i++) {
                time = time * 10 + (value[i] - '0');
            }
            out.collect(Tuple2.of(new String(record.key(), StandardCharsets.UTF_8), time));
        }

        @Override
        public TypeInformation<Tuple2<String, Long>> getProducedType() {
            return Types.TUPLE(Types.STRING, Types.LONG);
        }

        private static int indexOf(byte[] haystack, byte[] needle) {
            outer:
            for (int i = 0; i + needle.length <= haystack.length; i++) {
                for (int j = 0; j < needle.length; j++) {
                    if (haystack[i + j] != needle[j]) {
                        continue outer;
                    }
                }
                return i;
            }
            return -1;
        }
    }

    static final class Count implements AggregateFunction<Tuple2<String, Long>, Long, Long> {
        @Override
        public Long createAccumulator() {
            return 0L;
        }

        @Override
        public Long add(Tuple2<String, Long> event, Long count) {
            return count + 1;
        }

        @Override
        public Long getResult(Long count) {
            return count;
        }

        @Override
        public Long merge(Long a, Long b) {
            return a + b;
        }
    }

    /** A window's count as a record: key `<key>@<window start>`, value the count. */
    static final class Counts implements KafkaRecordSerializationSchema<Tuple3<String, Long, Long>> {
        private final String topic;

        Counts(String topic) {
            this.topic = topic;
        }

        @Override
        public ProducerRecord<byte[], byte[]> serialize(
                Tuple3<String, Long, Long> count, KafkaSinkContext context, Long timestamp) {
            return new ProducerRecord<>(topic,
                    (count.f0 + "@" + count.f1).getBytes(StandardCharsets.UTF_8),
                    Long.toString(count.f2).getBytes(StandardCharsets.UTF_8));
        }
    }

    /** (key, window start, count) of a fired window. */
    static final class WithWindow extends ProcessWindowFunction<Long, Tuple3<String, Long, Long>, String, TimeWindow> {
        @Override
        public void process(String key, Context context, Iterable<Long> counts, Collector<Tuple3<String, Long, Long>> out) {
            out.collect(Tuple3.of(key, context.window().getStart(), counts.iterator().next()));
        }
    }
}
