// flash_attention's K and V vec4s of a key group, read from the staged tiles by every lane.

// Nothing to set up (see flash_kv_subgroup.wgsl).
fn kv_lane(thread: u32) -> u32 {
    return thread;
}

// Head-size vec4 c of keys jg .. jg + KEY_GROUP - 1 (the rest of the array unused).
fn group_keys(jg: u32, c: u32, lane: u32) -> GroupRows {
    var k: GroupRows;
    for (var key = 0u; key < KEY_GROUP; key++) {
        k[key] = k_tile[(jg + key) * DK4 + c];
    }
    return k;
}

// Head-size vec4 c of the values of keys jg .. jg + KEY_GROUP - 1 (the rest unused).
fn group_values(jg: u32, c: u32, lane: u32) -> GroupRows {
    var v: GroupRows;
    for (var key = 0u; key < KEY_GROUP; key++) {
        v[key] = v_tile[(jg + key) * DV4 + c];
    }
    return v;
}
