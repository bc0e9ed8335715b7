//! What Redis holds for one device (pending set, stored read positions, its platform and
//! epoch marker, presence, overflow band), and freeing it all at once: when the device
//! logs out, or the worker's janitor expires it.

use fred::interfaces::{HashesInterface, KeysInterface};
use fred::prelude::*;

use crate::keys::{epoch_marker, DeviceKey, Keys};

/// Deletes what Redis holds for the device, in one pipeline (one slot: every key is
/// the user's).
pub async fn free(redis: &Pool, keys: &Keys, d: &DeviceKey) -> Result<(), fred::error::Error> {
    let client = redis.next();
    let pipe = client.pipeline();
    let _: () = pipe.del(vec![keys.pending_of(d), keys.reads(&d.tenant, &d.user, &d.device)]).await?;
    let fields = vec![
        d.device.clone(),
        epoch_marker(&d.device),
        format!("session:{}", d.device),
        format!("claimed:{}", d.device),
    ];
    let _: () = pipe.hdel(keys.devices(&d.tenant, &d.user), fields).await?;
    let _: () = pipe.hdel(keys.presence(&d.tenant, &d.user), d.device.as_str()).await?;
    let _: () = pipe.hdel(keys.overflow(&d.tenant, &d.user), d.device.as_str()).await?;
    let _: Vec<Value> = pipe.all().await?;
    Ok(())
}
