//! The engine end to end in one process: sharded index and scatter-gather against the
//! brute-force scan, over inproc and unix; a corrupted answer is caught and named.

use volley::service_client::Mode;
use volley_testbed::report::check;
use volley_testbed::run::Workload;
use volley_testbed::search::QueryClass;
use volley_testbed::{CodecKind, Config, CorpusSpec, Setup, Transport};

fn setup() -> Setup {
    Setup {
        corpus: CorpusSpec::Synthetic { docs: 80, seed: 5 },
        shards: 3,
        queries: 15,
        query_seed: 5,
        processes: false,
        exe: None,
        role_commands: Vec::new(),
        progress: false,
        adaptive_limit: false,
    }
}

fn configs() -> Vec<Config> {
    vec![
        Config::baseline(Transport::Inproc),
        Config { mode: Mode::Direct, batch: 8, codec: CodecKind::Fast, transport: Transport::Inproc },
        Config { mode: Mode::Direct, batch: 1, codec: CodecKind::Fast, transport: Transport::Unix },
        Config { mode: Mode::Relayed, batch: 8, codec: CodecKind::General, transport: Transport::Unix },
    ]
}

#[test]
fn sharded_index_and_scatter_gather_match_the_brute_force_scan() {
    let setup = setup();
    let report = volley_testbed::run(&setup, &configs()).unwrap();
    assert!(report.oracle_checked);
    assert_eq!(report.mismatch, None);
    assert_eq!(report.outcomes.len(), 4);
    let first = &report.outcomes[0];
    for o in &report.outcomes {
        // JSON may round a score's last bit on the way back (hence `compare`'s tolerance);
        // the bitcode configurations agree bit for bit.
        for (class, hits) in &first.results {
            let m = volley_testbed::search::compare(hits, &o.results[class]);
            assert_eq!(m, None, "{} {class:?}", o.config.name());
        }
        if o.config.codec == CodecKind::Fast {
            assert_eq!(o.results, report.outcomes[1].results, "{}", o.config.name());
        }
        assert_eq!(o.postings, first.postings);
        assert_eq!(o.results[&QueryClass::High].len(), 15);
    }
    // The answers are not trivially empty: the first high-frequency query (an OR) fills its top k.
    assert_eq!(first.results[&QueryClass::High][0].len(), volley_testbed::search::TOP_K);
    // Unix runs count traffic; a relayed call is four messages, a direct one two.
    let (direct_single, relayed_batch) = (&report.outcomes[2], &report.outcomes[3]);
    assert!(direct_single.messages > 0 && direct_single.bytes > 0);
    assert!(relayed_batch.messages < direct_single.messages);
}

#[test]
fn a_corrupted_answer_is_reported_with_its_query() {
    let setup = setup();
    let configs = &configs()[..2];
    let report = volley_testbed::run(&setup, configs).unwrap();
    let work = Workload::new(&setup).unwrap();
    assert_eq!(check(&work, &report.outcomes), None);

    let mut outcomes = report.outcomes.clone();
    let hits = &mut outcomes[1].results.get_mut(&QueryClass::High).unwrap()[3];
    hits[0].doc += 1;
    let msg = check(&work, &outcomes).expect("the corruption is found");
    let query = work.queries.iter().find(|(c, _)| *c == QueryClass::High).unwrap().1[3].to_string();
    assert!(msg.contains("direct+batch8+fast") && msg.contains("#3") && msg.contains(&query), "{msg}");

    let mut outcomes = report.outcomes.clone();
    outcomes[0].results.get_mut(&QueryClass::Low).unwrap()[7]
        .push(volley_testbed::search::Hit { doc: 1, score: 0.5 });
    let msg = check(&work, &outcomes).expect("an extra hit is found");
    assert!(msg.contains("relayed+single+general") && msg.contains("#7"), "{msg}");
}
