// Routes grouped by expert as moe.cu's moe_group lists them, for the
// emulation tests of the grouped expert kernels: slot s's routes, in route
// order, are order[offsets[s] .. offsets[s + 1]]; a slot the mask leaves
// out lists none, and a route past the bank is in no slot's list; and the
// check of a routed-expert launch's rows against the reference's
// (expect_route_rows).
#pragma once

#include "bit_checks.h"
#include "kernel_sources.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

// Whether the mask leaves slot s out (bit s of its words, when on): the
// host's own reading of SlotMask, apart from the kernels' slot_computed.
inline bool masked_out(const SlotMask& mask, u32 s) {
    return mask.on && !((mask.bits[s / 32] >> (s % 32)) & 1u);
}

struct ExpertOrder {
    std::vector<u32> order, offsets;
};

inline ExpertOrder expert_order(const std::vector<RouteOut>& routes, int slots,
                                const SlotMask& mask = SlotMask{}) {
    ExpertOrder o;
    o.offsets.assign(slots + 1, 0);
    for (int s = 0; s < slots; s++) {
        o.offsets[s] = (u32)o.order.size();
        if (masked_out(mask, (u32)s)) continue;
        for (size_t i = 0; i < routes.size(); i++)
            if (routes[i].slot == (u32)s) o.order.push_back((u32)i);
    }
    o.offsets[slots] = (u32)o.order.size();
    return o;
}

// Checks what a routed-expert launch over routes first .. first + n wrote
// (`got`: activations [n, inter], outputs [n, hidden]) against the
// reference rows of those routes, bit for bit: a route to a slot the mask
// leaves out must keep the `sentinel` its rows started with.
inline void expect_route_rows(const std::string& what,
                              const std::pair<std::vector<float>, std::vector<float>>& got,
                              const std::vector<float>& act_ref, const std::vector<float>& y_ref,
                              const std::vector<RouteOut>& routes, int first, int n, int inter,
                              int hidden, int slots, const SlotMask& mask, float sentinel) {
    std::vector<float> act(act_ref.begin() + (size_t)first * inter,
                           act_ref.begin() + (size_t)(first + n) * inter);
    std::vector<float> y(y_ref.begin() + (size_t)first * hidden,
                         y_ref.begin() + (size_t)(first + n) * hidden);
    for (int i = 0; i < n; i++) {
        u32 slot = routes[first + i].slot;
        if (slot < (u32)slots && masked_out(mask, slot)) {
            std::fill(act.begin() + (size_t)i * inter, act.begin() + (size_t)(i + 1) * inter, sentinel);
            std::fill(y.begin() + (size_t)i * hidden, y.begin() + (size_t)(i + 1) * hidden, sentinel);
        }
    }
    bits::expect_same(what + ", activations", got.first, act);
    bits::expect_same(what + ", outputs", got.second, y);
}
