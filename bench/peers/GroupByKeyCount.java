// The Kafka Streams peer of `make bench` (benches/node.rs): counts the update records per
// key of the benchmark topic with groupByKey().count() into its default RocksDB store and
// writes the changed counts to an output topic, at the processing guarantee it is given.
// It runs until it is stopped; the benchmark follows its progress through the offsets it
// commits for its application id.
//
//   java -cp 'libs/*:classes' GroupByKeyCount BOOTSTRAP INPUT OUTPUT APP_ID GUARANTEE STATE_DIR

import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

public final class GroupByKeyCount {
    public static void main(String[] args) throws InterruptedException {
        if (args.length != 6) {
            System.err.println("usage: GroupByKeyCount BOOTSTRAP INPUT OUTPUT APP_ID GUARANTEE STATE_DIR");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
        // exactly_once_v2 or at_least_once
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args[4]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[5]);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        // The exactly-once default for both guarantees, so both make their progress
        // durable equally often (at_least_once would otherwise commit every 30 s).
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[1], Consumed.with(Serdes.String(), Serdes.ByteArray()))
                .groupByKey()
                .count()
                .toStream()
                .to(args[2], Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            stopped.countDown();
        }));
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        System.out.println("started " + args[3] + " (" + args[4] + ")");
        stopped.await();
    }
}
