//! The MySQL server checked at start: band pages, recovery and sync read `mysql_url`,
//! so it must be the writable primary; a replica or a reader endpoint would let them
//! move past rows not yet replicated and lose pushes for good.

use herald_tests::faults::MariaDb;
use herald_tests::Cluster;

/// A read-only server (a replica, a reader endpoint, a primary demoted in a failover) is
/// refused by the gateway and the worker, each saying so; the same server, writable,
/// is taken. Before: both started and read from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_refused_at_start() {
    let server = MariaDb::start().await;
    let mut c = Cluster::new("readonly");
    c.mysql_url = format!("{}/{}", server.base_url(), c.db_name);
    herald_shared::db::migrate(&c.mysql_url).await.unwrap();
    let root = sqlx::MySqlPool::connect(&c.mysql_url).await.unwrap();
    sqlx::raw_sql("SET GLOBAL read_only = 1").execute(&root).await.unwrap();
    let gateway = c.try_start_gateway(&[]).await.expect_err("the gateway refuses a read-only server");
    assert!(gateway.contains("@@read_only is ON") && gateway.contains("primary"), "{gateway}");
    let worker = c.try_start_worker(&[]).await.expect_err("the worker refuses a read-only server");
    assert!(worker.contains("@@read_only is ON") && worker.contains("primary"), "{worker}");

    sqlx::raw_sql("SET GLOBAL read_only = 0").execute(&root).await.unwrap();
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let log = std::fs::read_to_string(c.log_dir.join(format!("{}.log", c.workers[0].name))).unwrap();
    assert!(log.contains("MySQL server checked") && log.contains("MariaDb"), "the flavour is logged:\n{log}");
}
