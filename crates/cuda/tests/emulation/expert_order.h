// Routes grouped by expert as moe.cu's moe_group lists them, for the
// emulation tests of the grouped expert kernels: slot s's routes, in route
// order, are order[offsets[s] .. offsets[s + 1]]; a slot the mask leaves
// out lists none, and a route past the bank is in no slot's list.
#pragma once

#include "kernel_sources.h"

#include <vector>

struct ExpertOrder {
    std::vector<u32> order, offsets;
};

inline ExpertOrder expert_order(const std::vector<RouteOut>& routes, int slots,
                                const SlotMask& mask = SlotMask{}) {
    ExpertOrder o;
    o.offsets.assign(slots + 1, 0);
    for (int s = 0; s < slots; s++) {
        o.offsets[s] = (u32)o.order.size();
        if (skipped(mask, (u32)s)) continue;
        for (size_t i = 0; i < routes.size(); i++)
            if (routes[i].slot == (u32)s) o.order.push_back((u32)i);
    }
    o.offsets[slots] = (u32)o.order.size();
    return o;
}
