//! Commands sent to Redis together, in one socket write.
//!
//! fred writes a pipeline's commands one at a time and flushes the socket after each:
//! it flushes when no other command is queued behind the one it writes
//! (`Counters::should_send`), and a whole pipeline is one queued item. A pipeline of n
//! commands costs n system calls in the client and n reads in Redis. Commands sent as
//! separate requests of one client, all queued before the client's connection task
//! runs, are fed to the socket one after another and flushed once, after the last.

use std::future::Future;
use std::pin::Pin;

use fred::prelude::*;

type Call<'a> = Pin<Box<dyn Future<Output = Result<Value, Error>> + Send + 'a>>;

/// Requests of one client, queued together: [`Batch::run`] sends them in the order they
/// were pushed and answers each, in that order. Unlike a pipeline, a failed command
/// does not fail the others; a broken connection fails every command still unanswered.
/// Commands on one key keep their order (one connection per Redis, written in order).
#[derive(Default)]
pub struct Batch<'a> {
    calls: Vec<Call<'a>>,
}

impl<'a> Batch<'a> {
    pub fn new() -> Self {
        Batch { calls: Vec::new() }
    }

    /// Adds a request: a command future of the client, not awaited yet.
    pub fn push(&mut self, call: impl Future<Output = Result<Value, Error>> + Send + 'a) {
        self.calls.push(Box::pin(call));
    }

    /// Adds a publish on a gateway's node channel ([`super::publish_to_node`]).
    pub fn publish_to_node(&mut self, client: &'a Client, channel: String, payload: String) {
        self.push(async move { super::publish_to_node(client, channel, payload).await.map(|()| Value::Null) });
    }

    pub fn len(&self) -> usize {
        self.calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Sends every request, then waits for all the answers. The first poll of `join_all`
    /// polls each request once, in order, and each sends its command then: all are
    /// queued before the connection task writes the first.
    pub async fn run(self) -> Vec<Result<Value, Error>> {
        futures::future::join_all(self.calls).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes() -> u64 {
        crate::process_metrics::thread_write_calls().expect("/proc/thread-self/io")
    }

    async fn client() -> Client {
        let url = std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
        let pool = crate::redis::pool(&url, &Default::default(), 1).await.expect("the test Redis");
        pool.next().clone()
    }

    /// 200 commands in a batch leave in a few socket writes (a pipeline of the same
    /// commands takes one each), and come back answered in their order.
    #[tokio::test]
    async fn a_batch_leaves_in_a_few_writes_and_answers_in_order() {
        let client = client().await;
        let key = format!("ut-batch-{:08x}", rand::random::<u32>());
        let _: () = client.set(&key, 0, Some(Expiration::EX(60)), None, false).await.unwrap();
        let before = writes();
        let mut batch = Batch::new();
        for _ in 0..200 {
            batch.push(client.incr::<Value, _>(&key));
        }
        let answers: Vec<i64> = batch.run().await.into_iter().map(|a| a.unwrap().as_i64().unwrap()).collect();
        let written = writes() - before;
        assert_eq!(answers, (1..=200).collect::<Vec<i64>>(), "answered in order, each command once");
        assert!(written <= 10, "200 commands took {written} write system calls");

        let pipe = client.pipeline();
        for _ in 0..200 {
            let _: () = pipe.incr(&key).await.unwrap();
        }
        let before = writes();
        let _: Vec<Value> = pipe.all().await.unwrap();
        let piped = writes() - before;
        assert!(piped > written, "a pipeline took {piped} writes, a batch {written}");
        let _: i64 = client.del(&key).await.unwrap();
    }

    /// A command that fails (a key of another type) fails alone.
    #[tokio::test]
    async fn a_failed_command_fails_alone() {
        let client = client().await;
        let key = format!("ut-batch-{:08x}", rand::random::<u32>());
        let _: () = client.set(&key, "text", Some(Expiration::EX(60)), None, false).await.unwrap();
        let mut batch = Batch::new();
        batch.push(client.get::<Value, _>(&key));
        batch.push(client.zadd::<Value, _, _>(&key, None, None, false, false, (1.0, "x")));
        batch.push(client.strlen::<Value, _>(&key));
        let answers = batch.run().await;
        assert_eq!(answers.len(), 3);
        assert_eq!(answers[0].as_ref().unwrap().as_string().as_deref(), Some("text"));
        assert!(answers[1].as_ref().is_err_and(|e| e.to_string().contains("WRONGTYPE")), "{:?}", answers[1]);
        assert_eq!(answers[2].as_ref().unwrap().as_i64(), Some(4));
        let _: i64 = client.del(&key).await.unwrap();
    }
}
