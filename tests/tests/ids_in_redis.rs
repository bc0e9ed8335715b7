//! Message ids above 2^53 in real Redis sorted sets: order, paging and removal stay
//! exact although the scores (f64) of neighbouring ids are equal.

use fred::prelude::*;
use herald_shared::ids::{MsgId, Snowflake, EPOCH_MS};
use herald_tests::shared_redis_url;

#[tokio::test]
async fn pending_sets_order_page_and_remove_ids_above_2_pow_53_exactly() {
    let redis = Builder::from_config(Config::from_url(&shared_redis_url()).unwrap()).build().unwrap();
    redis.init().await.unwrap();
    let key = format!("it{:08x}:ids", rand::random::<u32>());
    // A burst from one worker a year after the epoch: consecutive ids far above 2^53.
    let mut g = Snowflake::new(513);
    let t = EPOCH_MS + 365 * 24 * 3600 * 1000;
    let ids: Vec<MsgId> = (0..300).map(|_| g.next_at(t)).collect();
    assert!(ids[0].0 > 1 << 56, "far above 2^53");
    assert_eq!(ids[0].score(), ids[1].score(), "neighbours share a score");
    let mut shuffled = ids.clone();
    shuffled.reverse();
    for chunk in shuffled.chunks(37) {
        let pairs: Vec<(f64, String)> = chunk.iter().map(|i| (i.score(), i.member())).collect();
        let _: i64 = redis.zadd(&key, None, None, false, false, pairs).await.unwrap();
    }
    let all: Vec<String> = redis.zrange(&key, 0, -1, None, false, None, false).await.unwrap();
    let got: Vec<MsgId> = all.iter().map(|m| MsgId::from_member(m).unwrap()).collect();
    assert_eq!(got, ids, "ZRANGE returns ids in numeric order");

    // Page "after id X" by score, then drop boundary members <= X by their member.
    let after = ids[123];
    let page: Vec<String> = redis.zrangebyscore(&key, after.score(), "+inf", false, Some((0, 40))).await.unwrap();
    let page: Vec<MsgId> = page.iter().map(|m| MsgId::from_member(m).unwrap()).filter(|id| *id > after).collect();
    assert_eq!(page.first(), Some(&ids[124]), "the page starts right after X");
    assert!(page.windows(2).all(|w| w[1].0 == w[0].0 + 1));

    // Removing one id removes exactly that one.
    let removed: i64 = redis.zrem(&key, ids[200].member()).await.unwrap();
    assert_eq!(removed, 1);
    let left: Vec<String> = redis.zrange(&key, 0, -1, None, false, None, false).await.unwrap();
    assert_eq!(left.len(), 299);
    assert!(
        !left.contains(&ids[200].member()) && left.contains(&ids[199].member()) && left.contains(&ids[201].member())
    );
    let _: i64 = redis.del(&key).await.unwrap();
}

/// The backlog pager's page script: whatever the cursor, present in the set or already
/// acked and removed, the page is exactly the next ids, even where hundreds of ids share
/// the cursor's score (the pager once read "a page plus 128 from the score" and ended
/// early when more acked ids than that were still in the set).
#[tokio::test]
async fn the_pending_page_script_is_exact_after_any_cursor() {
    use herald_shared::scripts::PENDING_PAGE;
    let redis = Builder::from_config(Config::from_url(&shared_redis_url()).unwrap()).build().unwrap();
    redis.init().await.unwrap();
    let key = format!("it{:08x}:page", rand::random::<u32>());
    let start = 1u64 << 62;
    let ids: Vec<MsgId> = (start..start + 1_300).chain((1..=40).map(|k| start + 1_300 + k * 977)).map(MsgId).collect();
    assert_eq!(ids[600].score(), ids[1_299].score(), "hundreds of ids share one score");
    for chunk in ids.chunks(500) {
        let pairs: Vec<(f64, String)> = chunk.iter().map(|i| (i.score(), i.member())).collect();
        let _: i64 = redis.zadd(&key, None, None, false, false, pairs).await.unwrap();
    }
    let page = |cursor: Option<MsgId>, n: usize| {
        let (redis, key) = (redis.clone(), key.clone());
        async move {
            let (member, score) =
                cursor.map_or((String::new(), String::new()), |c| (c.member(), c.score().to_string()));
            let out: Vec<String> =
                PENDING_PAGE.call(&redis, vec![key], vec![member, score, n.to_string()]).await.unwrap();
            out.iter().map(|m| MsgId::from_member(m).unwrap()).collect::<Vec<_>>()
        }
    };
    assert_eq!(page(None, 200).await, ids[..200]);
    for at in [0, 199, 500, 1_023, 1_024, 1_299, 1_300, 1_320] {
        assert_eq!(page(Some(ids[at]), 200).await, ids[at + 1..(at + 201).min(ids.len())], "cursor {at} in the set");
    }
    // The cursor and everything before it acked and removed, except a few stragglers
    // (realtime pushes still unacked) below it.
    let gone: Vec<String> = ids[..900].iter().filter(|i| i.0 % 97 != 0).map(|i| i.member()).collect();
    let _: i64 = redis.zrem(&key, gone).await.unwrap();
    assert_eq!(page(Some(ids[899]), 300).await, ids[900..1_200], "cursor removed, hundreds of ids at its score");
    assert_eq!(page(Some(ids[ids.len() - 1]), 10).await, Vec::<MsgId>::new(), "nothing after the last");
    let _: i64 = redis.del(&key).await.unwrap();
}
