//! The programs of the tutorials in `tutorials/book`: each chapter's listings are one file
//! here, included into the chapter's page by mdBook anchors, so what a reader sees is what
//! `cargo test -p rusting_brain_tutorials` compiles and runs.
//!
//!     cargo run --release -p rusting_brain_tutorials -- 5        # chapter 5
//!     cargo run --release -p rusting_brain_tutorials -- all      # every chapter in order

mod ch01_neurons;
mod ch02_xor;
mod ch03_losses;
mod ch04_regression;
mod ch05_iris;
mod ch06_data;
mod ch07_optimizers;
mod ch08_files;
mod ch09_images;
mod ch10_gpu;
mod ch11_attention;
mod ch12_small_lm;
mod ch13_hugging_face;
mod ch14_tokenizers;
mod ch15_checkpoints;
mod ch16_lora_browser;

type Chapter = fn() -> Result<(), Box<dyn std::error::Error>>;

const CHAPTERS: [(&str, Chapter); 16] = [
    ("neurons and a forward pass by hand", ch01_neurons::main),
    ("XOR and gradient descent", ch02_xor::main),
    ("losses and activations", ch03_losses::main),
    ("regression", ch04_regression::main),
    ("classification: iris and the confusion matrix", ch05_iris::main),
    ("loading data", ch06_data::main),
    ("optimizers and reproducibility", ch07_optimizers::main),
    ("saving, loading, JSON and ONNX", ch08_files::main),
    ("images into a dense network", ch09_images::main),
    ("GPU basics", ch10_gpu::main),
    ("attention and the transformer block", ch11_attention::main),
    ("a small language model on the CPU", ch12_small_lm::main),
    ("Hugging Face models in and out", ch13_hugging_face::main),
    ("tokenizers", ch14_tokenizers::main),
    ("checkpoints, resuming and int8", ch15_checkpoints::main),
    ("fine-tuning with LoRA, and shipping to the browser", ch16_lora_browser::main),
];

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_default();
    let chosen: Vec<usize> = if arg == "all" {
        (1..=CHAPTERS.len()).collect()
    } else {
        match arg.parse::<usize>() {
            Ok(n) if (1..=CHAPTERS.len()).contains(&n) => vec![n],
            _ => {
                eprintln!("usage: tutorials <chapter 1-{}> | all\n", CHAPTERS.len());
                for (i, (title, _)) in CHAPTERS.iter().enumerate() {
                    eprintln!("{:>3}  {title}", i + 1);
                }
                std::process::exit(2);
            }
        }
    };
    for n in chosen {
        let (title, run) = CHAPTERS[n - 1];
        println!("== chapter {n}: {title}");
        if let Err(e) = run() {
            eprintln!("chapter {n} failed: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    // One test a chapter, so a failure names it; they run on cargo's test threads, so
    // chapters that write files use a folder of their own.
    macro_rules! chapter {
        ($name:ident) => {
            #[test]
            fn $name() {
                if let Err(e) = super::$name::main() {
                    panic!("{}: {e}", stringify!($name));
                }
            }
        };
    }
    chapter!(ch01_neurons);
    chapter!(ch02_xor);
    chapter!(ch03_losses);
    chapter!(ch04_regression);
    chapter!(ch05_iris);
    chapter!(ch06_data);
    chapter!(ch07_optimizers);
    chapter!(ch08_files);
    chapter!(ch09_images);
    chapter!(ch10_gpu);
    chapter!(ch11_attention);
    chapter!(ch12_small_lm);
    chapter!(ch13_hugging_face);
    chapter!(ch14_tokenizers);
    chapter!(ch15_checkpoints);
    chapter!(ch16_lora_browser);
}
