//! A tenant's device epoch (migration `0015_device_epochs.sql`): raised by every write
//! that changes which of the tenant's devices receive its messages, in that write's
//! transaction. The worker keeps each conversation's recipients between commits, read
//! under their tenant's epoch, and reads them again once the epoch moved, so no cached
//! recipient outlives a registration, a return, a logout, an expiry or a push token
//! change. A tenant without a row has epoch 0.

use std::collections::BTreeSet;

use sqlx::mysql::MySqlConnection;

/// Raises the epoch of every tenant of `tenants`, on `conn`: it must be in the
/// transaction of the write it answers for, after that write (the rows are locked in
/// the same order, devices then epochs, by every writer, so raises never deadlock with
/// each other). Nothing is done for no tenant.
pub async fn raise<'a>(
    conn: &mut MySqlConnection,
    tenants: impl IntoIterator<Item = &'a str>,
) -> Result<(), sqlx::Error> {
    let tenants: BTreeSet<&str> = tenants.into_iter().collect();
    if tenants.is_empty() {
        return Ok(());
    }
    let values = vec!["(?, 1)"; tenants.len()].join(", ");
    let sql = format!(
        "INSERT INTO device_epochs (tenant_id, epoch) VALUES {values} ON DUPLICATE KEY UPDATE epoch = epoch + 1"
    );
    // Kept prepared for one tenant only (nearly always): other texts vary.
    let mut q = sqlx::query(&sql).persistent(tenants.len() == 1);
    for t in tenants {
        q = q.bind(t);
    }
    q.execute(conn).await?;
    Ok(())
}
