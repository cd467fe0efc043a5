//! Times Kimi K3's tokenizer on one long word: `encode_long_word TIKTOKEN_MODEL WORD BYTES...`
//! encodes WORD repeated to each BYTES (a single split piece, the merge's worst case) and prints
//! one JSON line per size: `{"bytes", "tokens", "seconds"}`. `bench/long_prompt.sh` runs it
//! beside tiktoken on the same vocabulary.

use std::time::Instant;

use minirun_text::tiktoken::KimiText;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, word, sizes @ ..] = args.as_slice() else {
        return Err("usage: encode_long_word TIKTOKEN_MODEL WORD BYTES...".into());
    };
    let text = KimiText::parse(&std::fs::read(model)?)?;
    for size in sizes {
        let bytes: usize = size.parse()?;
        let long = word.repeat(bytes.div_ceil(word.len().max(1)));
        let started = Instant::now();
        let ids = text.encode(&long)?;
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{{\"bytes\": {}, \"tokens\": {}, \"seconds\": {seconds:.6}}}",
            long.len(),
            ids.len()
        );
    }
    Ok(())
}
