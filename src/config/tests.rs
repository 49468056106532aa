//! Tests of the whole configuration: the repository's region files, defaults, secrets
//! kept out of `Debug`, and the errors a bad file gets.

use super::*;
use crate::crdt::CrdtType;

/// Regions must agree on what decides a key's fate everywhere (namespaces, the limits
/// a merge checks, the clock bound) and on the lease group; the repository's region
/// files and the witness's are checked here.
#[test]
fn the_region_files_agree_on_namespaces_limits_and_the_lease_group() {
    let load =
        |region: &str| Config::load(&crate::repo_file(&format!("regions/{region}.toml"))).unwrap();
    let (us, eu) = (load("us-east-1"), load("eu-west-1"));
    let witness = WitnessConfig::load(&crate::repo_file("regions/witness.toml"), &[]).unwrap();
    let shared = |c: &Config| {
        let i = &c.ingest;
        // and the formula: whichever region holds a geohash prices it alike
        format!(
            "{:?} {:?} {} {} {} {:?}",
            c.namespaces,
            c.max_clock_offset,
            i.max_key_bytes,
            i.max_value_bytes,
            i.max_id_bytes,
            c.pricing
        )
    };
    assert_eq!(shared(&us), shared(&eu));
    // the group as a whole: everything but which member this file is
    let group = |l: &LeaseConfig| {
        format!(
            "{:?}",
            LeaseConfig {
                member_id: 0,
                listen: "0.0.0.0:0".parse().unwrap(),
                ..l.clone()
            }
        )
    };
    let (us_group, eu_group) = (
        group(us.lease.as_ref().unwrap()),
        group(eu.lease.as_ref().unwrap()),
    );
    assert_eq!(us_group, eu_group);
    assert_eq!(us_group, group(&witness.lease));
    assert_eq!(us.max_clock_offset, witness.max_clock_offset);
    // and each file is the member it says it is
    for (config, region) in [(&us, "us-east-1"), (&eu, "eu-west-1")] {
        let lease = config.lease.as_ref().unwrap();
        let me = &lease.members[&lease.member_id];
        assert_eq!(me.region.as_ref().map(|r| r.as_str()), Some(region));
        assert_eq!(me.addr, lease.listen.to_string());
    }
}

/// A region's further node is learner `n` under its region's member (Raft id in the
/// member's high half); the witness cannot be one.
#[test]
fn a_further_node_is_a_learner_under_its_regions_member() {
    let set = |s: &str| vec![s.parse::<Setting>().unwrap()];
    let us = crate::repo_file("regions/us-east-1.toml");
    let node = Config::load_with(&us, &set("lease.learner=3")).unwrap();
    let lease = node.lease.unwrap();
    assert_eq!((lease.member_id, lease.learner), (2, 3));
    assert_eq!(lease.raft_id(), (2 << 32) | 3);
    let first = Config::load(&us).unwrap().lease.unwrap();
    assert_eq!(first.raft_id(), 2);
    let witness = crate::repo_file("regions/witness.toml");
    let e = WitnessConfig::load(&witness, &set("lease.learner=1")).unwrap_err();
    assert!(e.to_string().contains("lease.learner"), "{e}");
    let anywhere = [
        "lease.learner=1".parse::<Setting>().unwrap(),
        "lease.listen=\"0.0.0.0:7400\"".parse().unwrap(),
    ];
    let e = Config::load_with(&us, &anywhere).unwrap_err();
    assert!(e.to_string().contains("lease.listen"), "{e}");
}

/// Operators are certificate names apart from the members': a member listed as one would
/// remove any region.
#[test]
fn an_operator_names_no_member() {
    let set = |s: &str| vec![s.parse::<Setting>().unwrap()];
    let us = crate::repo_file("regions/us-east-1.toml");
    let node = Config::load_with(&us, &set(r#"lease.operators=["geostate-operator"]"#)).unwrap();
    assert_eq!(node.lease.unwrap().operators, ["geostate-operator"]);
    for (operators, why) in [
        (r#"["eu-west-1"]"#, "a member's name"),
        (r#"[""]"#, "empty"),
    ] {
        let e = Config::load_with(&us, &set(&format!("lease.operators={operators}"))).unwrap_err();
        assert!(e.to_string().contains("lease.operators"), "{e}");
        assert!(e.to_string().contains(why), "{e}");
    }
}

/// A role's limits: the burst defaults to a second's worth of the rate; a rate of 0, a
/// burst under 1 and a concurrency of 0 are refused by name.
#[test]
fn a_roles_limits_are_checked() {
    let set = |s: &str| vec![s.parse::<Setting>().unwrap()];
    let us = crate::repo_file("regions/us-east-1.toml");
    let node = Config::load_with(
        &us,
        &set("api.limits.write={ rate = 2000, concurrency = 64 }"),
    );
    let write = &node.unwrap().api.limits[&Role::Write];
    assert_eq!(
        (write.rate, write.burst, write.concurrency),
        (2000.0, 2000.0, Some(64))
    );
    for bad in [
        "{ rate = 0 }",
        "{ rate = 5, burst = 0.5 }",
        "{ rate = 5, concurrency = 0 }",
    ] {
        let e = Config::load_with(&us, &set(&format!("api.limits.read={bad}"))).unwrap_err();
        assert!(e.to_string().contains("api.limits"), "{e}");
    }
}

const MINIMAL: &str = r#"
        region = "us-east-1"
        data-dir = "/tmp/x"
        [kafka]
        bootstrap = "127.0.0.1:9092"
        [api]
        grpc-listen = "127.0.0.1:0"
        metrics-listen = "127.0.0.1:0"
        [[namespace]]
        prefix = "trips/"
        type = "g_counter"
        ownership = "shared"
        [[namespace]]
        prefix = "surge/"
        type = "lww_register"
        ownership = "owned"
    "#;

#[test]
fn a_minimal_config_gets_defaults() {
    let c = Config::parse(MINIMAL).unwrap();
    assert_eq!(c.region.as_str(), "us-east-1");
    assert_eq!(c.max_clock_offset, Duration::from_millis(500));
    assert_eq!(c.kafka.updates_topic, "geostate.updates");
    assert_eq!(c.kafka.format, RecordFormat::Json);
    assert_eq!(c.ingest.batch_max_events, 1000);
    let ns = c.namespaces.lookup("surge/9q8yy").unwrap();
    assert_eq!(
        (ns.crdt, ns.ownership),
        (CrdtType::LwwRegister, Ownership::Owned)
    );
    assert!(c.namespaces.lookup("nothing/here").is_none());
    assert!(c.namespaces.lookup("surge").is_none());
    assert!(c.replication.remotes.is_empty());
}

/// `Debug` of a configuration (what a log line or a panic would print) never shows
/// a password or a secret key.
#[test]
fn the_debug_of_a_config_hides_its_secrets() {
    let text = MINIMAL.replace(
        "[api]",
        "[kafka.client]\n\"sasl.password\" = \"kafka-pw-1234\"\n\"ssl.key.pem\" = \"pem-9876\"\n\"linger.ms\" = \"5\"\n[api]",
    );
    let text = format!(
        "{text}\n[checkpoint.s3]\nbucket = \"b\"\naccess-key = \"AKID\"\nsecret-key = \"s3-secret-5678\"\n"
    );
    let c = Config::parse(&text).unwrap();
    let shown = format!("{c:?}");
    for secret in ["kafka-pw-1234", "pem-9876", "s3-secret-5678"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(
        shown.contains("linger.ms") && shown.contains("AKID"),
        "{shown}"
    );
}

#[test]
fn remotes_default_to_the_mirrored_topic_on_the_own_cluster() {
    let text = format!(
        "{MINIMAL}\n[[replication.remote]]\nregion = \"eu-west-1\"\n[[replication.remote]]\nregion = \"ap-south-1\"\ntopic = \"geostate.deltas\"\nbootstrap = \"10.0.0.1:9092\"\n"
    );
    let c = Config::parse(&text).unwrap();
    assert_eq!(c.replication.remotes[0].topic, "eu-west-1.geostate.deltas");
    assert_eq!(c.replication.remotes[0].bootstrap, "127.0.0.1:9092");
    assert_eq!(c.replication.remotes[1].bootstrap, "10.0.0.1:9092");
    let itself = format!("{MINIMAL}\n[[replication.remote]]\nregion = \"us-east-1\"\n");
    assert!(Config::parse(&itself).is_err());
}

#[test]
fn the_example_region_files_are_valid() {
    for region in ["us-east-1", "eu-west-1"] {
        let path = crate::repo_file(&format!("regions/{region}.toml"));
        let c = Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(c.region.as_str(), region);
        for (prefix, crdt, ownership) in [
            ("trips/", CrdtType::GCounter, Ownership::Shared),
            ("drivers/", CrdtType::PnCounter, Ownership::Shared),
            ("zones/", CrdtType::LwwRegister, Ownership::Shared),
            ("surge/", CrdtType::LwwRegister, Ownership::Owned),
        ] {
            let ns = c.namespaces.lookup(&format!("{prefix}9q8yy")).unwrap();
            assert_eq!((ns.crdt, ns.ownership), (crdt, ownership), "{prefix}");
        }
    }
}

#[test]
fn only_a_windowed_namespace_outputs_its_final_windows() {
    let windowed = format!(
        "{MINIMAL}\n[[namespace]]\nprefix = \"requests/\"\ntype = \"g_counter\"\nownership = \"shared\"\noutput = \"final-windows\"\n[namespace.window]\nsize = \"1m\"\n"
    );
    let c = Config::parse(&windowed).unwrap();
    let outputs = |key| c.namespaces.lookup(key).unwrap().outputs_final_windows;
    assert!(outputs("requests/9q8yy") && !outputs("trips/9q8yy"));
    assert_eq!(c.kafka.outputs_topic, "geostate.outputs");
    let plain = MINIMAL.replace(
        "ownership = \"shared\"",
        "ownership = \"shared\"\noutput = \"final-windows\"",
    );
    let err = Config::parse(&plain).unwrap_err().to_string();
    assert!(
        err.contains("namespace.output") && err.contains("no window"),
        "{err}"
    );
    let owned = MINIMAL.replace(
        "ownership = \"owned\"",
        "ownership = \"owned\"\noutput = \"register-changes\"",
    );
    let c = Config::parse(&owned).unwrap();
    assert!(
        c.namespaces
            .lookup("surge/9q8yy")
            .unwrap()
            .outputs_register_changes
    );
    let shared = owned.replace("\"owned\"", "\"shared\"");
    let err = Config::parse(&shared).unwrap_err().to_string();
    assert!(err.contains("not an owned lww_register"), "{err}");
    let unknown = windowed.replace("\"final-windows\"", "\"every-change\"");
    let err = Config::parse(&unknown).unwrap_err().to_string();
    assert!(err.contains("not an output kind"), "{err}");
}

#[test]
fn pricing_needs_demand_and_supply_windowed_alike_and_an_owned_register_that_outputs() {
    let counter = |prefix: &str, size: &str| {
        format!(
            "[[namespace]]\nprefix = \"{prefix}\"\ntype = \"g_counter\"\nownership = \"shared\"\n[namespace.window]\nsize = \"{size}\"\n"
        )
    };
    let text = |supply_size: &str, prices_output: &str| {
        format!(
            "{MINIMAL}\n{}{}[[namespace]]\nprefix = \"prices/\"\ntype = \"lww_register\"\nownership = \"owned\"\n{prices_output}\n[pricing]\ndemand = \"requests/\"\nsupply = \"supply/\"\nprices = \"prices/\"\n",
            counter("requests/", "1m"),
            counter("supply/", supply_size)
        )
    };
    let outputs = "output = \"register-changes\"";
    let c = Config::parse(&text("1m", outputs)).unwrap();
    let pricing = c.pricing.unwrap();
    assert_eq!(pricing.formula.hundredths(30, 10), 200);
    assert_eq!(pricing.window.size_ms, 60_000);
    let err = Config::parse(&text("2m", outputs)).unwrap_err().to_string();
    assert!(err.contains("must have the windows of"), "{err}");
    let err = Config::parse(&text("1m", "")).unwrap_err().to_string();
    assert!(err.contains("pricing.prices"), "{err}");
    let err =
        Config::parse(&text("1m", outputs).replace("supply = \"supply/\"", "supply = \"trips/\""))
            .unwrap_err()
            .to_string();
    assert!(err.contains("not a windowed namespace"), "{err}");
}

#[test]
fn unknown_fields_are_refused() {
    let text = MINIMAL.replace("[kafka]", "[kafka]\nbootstrapp = \"x\"");
    let err = Config::parse(&text).unwrap_err().to_string();
    assert!(err.contains("unknown field `bootstrapp`"), "{err}");
}

#[test]
fn overlapping_namespaces_are_refused() {
    let text = format!(
        "{MINIMAL}\n[[namespace]]\nprefix = \"trips/vip/\"\ntype = \"g_counter\"\nownership = \"shared\"\n"
    );
    let err = Config::parse(&text).unwrap_err().to_string();
    assert!(err.contains("overlap"), "{err}");
}

#[test]
fn bad_types_durations_and_addresses_are_refused() {
    let bad_type = MINIMAL.replace("\"g_counter\"", "\"counter\"");
    assert!(Config::parse(&bad_type).is_err());
    let bad_duration = MINIMAL.replace("region =", "max-clock-offset = \"5 parsecs\"\nregion =");
    let err = Config::parse(&bad_duration).unwrap_err().to_string();
    assert!(err.contains("max-clock-offset"), "{err}");
    assert!(parse_duration("interval", "87600h").is_ok());
    let err = parse_duration("interval", "87601h")
        .unwrap_err()
        .to_string();
    assert!(err.contains("longer than 10 years"), "{err}");
    let shifted = |offset: &str| {
        Config::parse(&MINIMAL.replace(
            "region =",
            &format!("clock-offset = \"{offset}\"\nregion ="),
        ))
        .map(|c| c.clock_offset_nanos)
    };
    assert_eq!(shifted("2s").unwrap(), 2_000_000_000);
    assert_eq!(shifted("-250ms").unwrap(), -250_000_000);
    assert_eq!(Config::parse(MINIMAL).unwrap().clock_offset_nanos, 0);
    assert!(shifted("--1s").is_err());
    let replication = |setting: &str| {
        Config::parse(&format!("{MINIMAL}\n[replication]\n{setting}\n"))
            .map(|c| (c.replication.ship_every, c.replication.compression))
    };
    assert_eq!(
        replication("ship-every = \"250ms\"").unwrap(),
        (Duration::from_millis(250), "zstd")
    );
    let err = replication("ship-every = \"2s\"").unwrap_err().to_string();
    assert!(err.contains("heartbeat interval"), "{err}");
    let err = replication("compression = \"brotli\"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("replication.compression"), "{err}");
    assert_eq!(replication("compression = \"lz4\"").unwrap().1, "lz4");
    let bad_addr = MINIMAL.replace("grpc-listen = \"127.0.0.1:0\"", "grpc-listen = \"nowhere\"");
    let err = Config::parse(&bad_addr).unwrap_err().to_string();
    assert!(err.contains("api.grpc-listen"), "{err}");
}

#[test]
fn durations_parse() {
    let d = |s| parse_duration("f", s);
    assert_eq!(d("250ms").unwrap(), Duration::from_millis(250));
    assert_eq!(d("15s").unwrap(), Duration::from_secs(15));
    assert_eq!(d("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(d("1h").unwrap(), Duration::from_secs(3600));
    for bad in ["", "ms", "5", "5 s", "-1s", "1.5s", "3d"] {
        assert!(d(bad).is_err(), "{bad:?}");
    }
}
