// flash_attention's K and V vec4s of a key group, shared across a subgroup: lane l reads key
// jg + l (and jg + 8 + l) from the staged tile and the others take it by subgroupBroadcast,
// one workgroup read per lane and 8 keys instead of eight. On a CPU device every lane's read
// is a separate scalar access, while a broadcast from a constant lane is one register move.
// The host picks this only where a workgroup is exactly one subgroup of 8 lanes (THREADS),
// all active. Needs the device feature SUBGROUP (no `enable` directive: see
// linear_subgroup.wgsl).

// The lane's index in its subgroup (all lanes active here, at the top of main).
fn kv_lane(thread: u32) -> u32 {
    return subgroupExclusiveAdd(1u);
}

// Lane l's `mine` (its read of key l of eight), in every lane.
fn broadcast_eight(mine: vec4<f32>) -> array<vec4<f32>, 8> {
    return array<vec4<f32>, 8>(
        subgroupBroadcast(mine, 0u),
        subgroupBroadcast(mine, 1u),
        subgroupBroadcast(mine, 2u),
        subgroupBroadcast(mine, 3u),
        subgroupBroadcast(mine, 4u),
        subgroupBroadcast(mine, 5u),
        subgroupBroadcast(mine, 6u),
        subgroupBroadcast(mine, 7u),
    );
}

// The group's rows from two sets of eight (the second unused with 8 keys).
fn group_rows(a: array<vec4<f32>, 8>, b: array<vec4<f32>, 8>) -> GroupRows {
    return GroupRows(
        a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
    );
}

// Head-size vec4 c of keys jg .. jg + KEY_GROUP - 1.
fn group_keys(jg: u32, c: u32, lane: u32) -> GroupRows {
    let a = broadcast_eight(k_tile[(jg + lane) * DK4 + c]);
    var b = array<vec4<f32>, 8>();
    if (KEY_GROUP == 16u) {
        b = broadcast_eight(k_tile[(jg + 8u + lane) * DK4 + c]);
    }
    return group_rows(a, b);
}

// Head-size vec4 c of the values of keys jg .. jg + KEY_GROUP - 1.
fn group_values(jg: u32, c: u32, lane: u32) -> GroupRows {
    let a = broadcast_eight(v_tile[(jg + lane) * DV4 + c]);
    var b = array<vec4<f32>, 8>();
    if (KEY_GROUP == 16u) {
        b = broadcast_eight(v_tile[(jg + 8u + lane) * DV4 + c]);
    }
    return group_rows(a, b);
}
