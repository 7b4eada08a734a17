//! The picture thread: one text-to-image pipeline behind a bounded queue, a request at a
//! time (a picture already fills the cores). A request whose client has gone is skipped,
//! or stopped at its next denoising step.

use rusting_brain::image_pipeline::{Family, ImagePipeline};
use rusting_brain::vae::encode_png;
use tokio::sync::oneshot;

use crate::queue::{self, Busy, Queue};

/// One picture for the thread.
pub struct ImageJob {
    /// What to paint.
    pub prompt: String,
    /// Columns and rows.
    pub width: usize,
    /// See `width`.
    pub height: usize,
    /// The starting noise's seed; `None` draws one.
    pub seed: Option<u64>,
    /// The PNG's bytes, or why there are none; a closed channel means the client left.
    pub reply: oneshot::Sender<Result<Vec<u8>, Refused>>,
}

/// Why a picture was not painted.
#[derive(Debug)]
pub enum Refused {
    /// The size is not one the pipeline paints (off its grid): the client's fault.
    Size(String),
    /// The pipeline failed.
    Failed(String),
}

/// The handlers' side of the picture thread.
#[derive(Clone)]
pub struct Painter {
    jobs: Queue<ImageJob>,
    /// The size a request without one gets: the family's native resolution.
    pub default_size: (usize, usize),
}

impl Painter {
    /// Starts the picture thread over `pipeline`, `max_queue` requests waiting at most.
    pub fn start(mut pipeline: ImagePipeline, max_queue: usize) -> Painter {
        let side = match pipeline.family() {
            Family::Sd => 512,
            _ => 1024,
        };
        let (jobs, inbox) = queue::bounded::<ImageJob>(max_queue);
        std::thread::Builder::new()
            .name("painter".into())
            .spawn(move || {
                while let Some(job) = inbox.recv() {
                    if job.reply.is_closed() {
                        continue;
                    }
                    if let Err(e) = pipeline.latent_shape(job.width, job.height) {
                        let _ = job.reply.send(Err(Refused::Size(e.to_string())));
                        continue;
                    }
                    let left = || job.reply.is_closed();
                    let picture = pipeline
                        .generate(&job.prompt, job.width, job.height, job.seed, |_, _| !left())
                        .and_then(|image| encode_png(&image))
                        .map_err(|e| Refused::Failed(e.to_string()));
                    let _ = job.reply.send(picture);
                }
            })
            .expect("starting the picture thread");
        Painter { jobs, default_size: (side, side) }
    }

    /// Queues `job`, or refuses it when `max_queue` pictures already wait.
    pub fn submit(&self, job: ImageJob) -> Result<(), Busy> {
        self.jobs.submit(job)
    }
}
