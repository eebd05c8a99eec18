//! The BPE trainer: determinism, the committed fixture, and agreement with HF's `BpeTrainer`.

mod common;

use common::{corpus, fixture};
use ember_tokenizer::{BpeTrainer, NoProgress, Tokenizer, TrainProgress};

/// Same settings as examples/train_fixture.rs.
fn train_fixture_settings() -> ember_tokenizer::TrainedBpe {
    let text = corpus();
    BpeTrainer::new(500)
        .special_tokens(["<|endoftext|>"])
        .train_texts(&[&text[..200_000]], &mut NoProgress)
        .unwrap()
}

#[test]
fn training_reproduces_the_committed_tokenizer_json_byte_for_byte() {
    let committed = std::fs::read_to_string(fixture("ours_trained.tokenizer.json")).unwrap();
    assert_eq!(train_fixture_settings().to_json_string(), committed);
}

#[test]
fn trained_merges_equal_hf_bpe_trainer_merges() {
    // hf_trained.tokenizer.json: HF BpeTrainer, same corpus slice, vocab size, special token and GPT-2 ByteLevel
    // pre-tokenizer. Both trainers pick the highest count and break ties by the lowest pair of ids.
    let ours: serde_json::Value =
        serde_json::from_str(&train_fixture_settings().to_json_string()).unwrap();
    let hf = common::fixture_json("hf_trained.tokenizer.json");
    assert_eq!(ours["model"]["merges"], hf["model"]["merges"]);
    assert_eq!(ours["model"]["vocab"], hf["model"]["vocab"]);
}

#[test]
fn trained_tokenizer_round_trips_and_compresses_its_corpus() {
    let tok = train_fixture_settings().tokenizer().unwrap();
    assert_eq!(tok.vocab_size(), 500);
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(0));
    let text = corpus();
    let ids = tok.encode(&text).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), text);
    // More merges must compress strictly better on the text they were learned from (bytes per token here is
    // 1.88 with 243 merges; 1.0 would mean no merge ever applied).
    let smaller = BpeTrainer::new(400)
        .special_tokens(["<|endoftext|>"])
        .train_texts(&[&text[..200_000]], &mut NoProgress)
        .unwrap()
        .tokenizer()
        .unwrap();
    let fewer_merges = smaller.encode(&text).unwrap();
    assert!(
        ids.len() < fewer_merges.len(),
        "{} vs {}",
        ids.len(),
        fewer_merges.len()
    );
    assert!(text.len() as f64 / ids.len() as f64 > 1.5);
}

#[test]
fn training_reports_progress_and_rejects_too_small_vocab() {
    #[derive(Default)]
    struct Record(Vec<(String, u64)>, u64);
    impl TrainProgress for Record {
        fn phase(&mut self, name: &str, total: u64) {
            self.0.push((name.to_owned(), total));
        }
        fn advance(&mut self, done: u64) {
            self.1 += done;
        }
    }
    let mut rec = Record::default();
    let trained = BpeTrainer::new(300)
        .train_texts(&["abab abab cdcd"], &mut rec)
        .unwrap();
    assert_eq!(
        rec.0.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        ["counting words", "learning merges"]
    );
    assert_eq!(rec.0[1].1, 300 - 256);
    // Bytes read (14) plus one per merge.
    assert_eq!(rec.1, 14 + trained.num_merges() as u64);
    assert!(
        BpeTrainer::new(100)
            .train_texts(&["x"], &mut NoProgress)
            .is_err()
    );
}

#[test]
fn train_tokenizer_files_writes_a_loadable_tokenizer_json() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "the cat sat on the mat. the cat sat.\n").unwrap();
    let out = dir.path().join("tok");
    let tok = ember_tokenizer::train_tokenizer_files(
        &[input],
        270,
        &["<|endoftext|>".into()],
        &out,
        &mut NoProgress,
    )
    .unwrap();
    let reloaded = Tokenizer::from_path(&out).unwrap();
    let text = "the cat<|endoftext|> sat";
    assert_eq!(tok.encode(text).unwrap(), reloaded.encode(text).unwrap());
    assert_eq!(reloaded.encode("<|endoftext|>").unwrap(), [0]);
}
