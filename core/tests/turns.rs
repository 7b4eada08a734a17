//! The conversation bookkeeping every decoding engine shares: what a feed refuses, and
//! how a reply ends.

use rusting_brain_core::models::transformer::{Conversation, Finish, Reply, TransformerConfig, Turn};

fn config(max_seq_len: usize) -> TransformerConfig {
    TransformerConfig::llama(10, 4, 1, (2, 1, 2), 6, max_seq_len)
}

/// Runs the engines' loop over `draws` (what a sampler would give), feeding as told.
fn run(
    conv: &mut Conversation, reply: &mut Reply, draws: &[u32], stop_at: Option<u32>,
) -> (Finish, Vec<u32>) {
    let mut fed = Vec::new();
    let mut draws = draws.iter();
    let finish = loop {
        if let Some(f) = reply.before_draw() {
            break f;
        }
        let id = *draws.next().expect("enough draws");
        match reply.drawn(conv, id, |t| Some(t) != stop_at) {
            Turn::Done(f) => break f,
            Turn::Feed { stop } => {
                conv.check_feed(&[id]).unwrap();
                conv.fed(&[id]);
                fed.push(id);
                if stop {
                    break Finish::Stopped;
                }
            }
        }
    };
    (finish, fed)
}

#[test]
fn a_refused_feed_changes_nothing() {
    let mut conv = Conversation::new(&config(4));
    conv.check_feed(&[1, 2]).unwrap();
    conv.fed(&[1, 2]);
    let empty = conv.check_feed(&[]).unwrap_err().to_string();
    assert!(empty.contains("no tokens"), "{empty}");
    let outside = conv.check_feed(&[3, 10]).unwrap_err().to_string();
    assert!(outside.contains("vocabulary") && outside.contains("10"), "{outside}");
    let long = conv.check_feed(&[1, 2, 3]).unwrap_err().to_string();
    assert!(long.contains("max_seq_len 4"), "{long}");
    assert_eq!(conv.context(), &[1, 2]);
    assert_eq!(conv.room(), 2);
    conv.clear();
    assert_eq!((conv.context(), conv.room()), (&[][..], 4));
}

#[test]
fn replies_end_at_length_at_the_end_id_when_stopped_and_at_a_full_cache() {
    // Length: every id but the last is fed back (nothing reads the last).
    let mut conv = Conversation::new(&config(16));
    conv.fed(&[1]);
    let mut reply = Reply::new(3, None);
    assert_eq!(run(&mut conv, &mut reply, &[4, 5, 6], None), (Finish::Length, vec![4, 5, 6]));
    assert_eq!(reply.ids(), &[4, 5, 6]);

    // The end id ends the reply and is neither handed on nor kept.
    let mut conv = Conversation::new(&config(16));
    conv.fed(&[1]);
    let mut reply = Reply::new(9, Some(7));
    assert_eq!(run(&mut conv, &mut reply, &[4, 7, 5], None), (Finish::End, vec![4]));
    assert_eq!((reply.ids(), conv.context()), (&[4][..], &[1, 4][..]));

    // A stop still feeds the id, so the conversation continues from it.
    let mut conv = Conversation::new(&config(16));
    conv.fed(&[1]);
    let mut reply = Reply::new(9, None);
    assert_eq!(run(&mut conv, &mut reply, &[4, 5, 6], Some(5)), (Finish::Stopped, vec![4, 5]));
    assert_eq!(conv.context(), &[1, 4, 5]);

    // A full cache: the last drawn id is the reply's last and stays in the context.
    let mut conv = Conversation::new(&config(3));
    conv.fed(&[1]);
    let mut reply = Reply::new(9, None);
    assert_eq!(run(&mut conv, &mut reply, &[4, 5, 6, 8], None), (Finish::MaxSeqLen, vec![4, 5]));
    assert_eq!((reply.ids(), conv.context()), (&[4, 5, 6][..], &[1, 4, 5, 6][..]));
    assert_eq!(conv.room(), 0);
    assert_eq!(Finish::MaxSeqLen.as_str(), "max_seq_len");
}
