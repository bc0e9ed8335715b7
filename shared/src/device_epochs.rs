//! A tenant's device epoch (migration `0015_device_epochs.sql`): raised by every write
//! that changes which of the tenant's devices receive its messages, in that write's
//! transaction. The worker keeps each conversation's recipients between commits, read
//! under their tenant's epoch, and reads them again once the epoch moved, so no cached
//! recipient outlives a registration, a return, a logout, an expiry or a push token
//! change. A tenant without a row has epoch 0.

use std::collections::BTreeSet;

use sqlx::mysql::MySqlConnection;

use crate::sql_script::Script;

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
    let mut script = Script::default();
    push_raise(&mut script, tenants);
    script.run(conn).await?;
    Ok(())
}

/// The raise as a statement of a text script (no `;` around it), for a write that
/// runs its transaction as one script; `tenants` must not be empty.
pub fn push_raise<'a>(script: &mut Script, tenants: impl IntoIterator<Item = &'a str>) {
    let tenants: BTreeSet<&str> = tenants.into_iter().collect();
    script.push("INSERT INTO device_epochs (tenant_id, epoch) VALUES ");
    for (i, t) in tenants.into_iter().enumerate() {
        script.push(if i > 0 { ", (" } else { "(" }).str(t).push(", 1)");
    }
    script.push(" ON DUPLICATE KEY UPDATE epoch = epoch + 1");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scripted_raise_names_each_tenant_once_in_order() {
        let mut s = Script::default();
        push_raise(&mut s, ["u", "t", "u"]);
        assert_eq!(
            s.as_str(),
            "INSERT INTO device_epochs (tenant_id, epoch) VALUES (_utf8mb4 X'74', 1), (_utf8mb4 X'75', 1) \
             ON DUPLICATE KEY UPDATE epoch = epoch + 1"
        );
    }
}
