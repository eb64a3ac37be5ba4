// Bit-for-bit comparison of a kernel's outputs with a reference, for the
// emulation tests: prints one line a check (and the first mismatches),
// counts the failed checks.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace bits {

inline int failures = 0;

inline double seconds() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Every value of `got` must have the bits of `want`'s.
inline void expect_same(const std::string& what, const std::vector<float>& got,
                        const std::vector<float>& want) {
    static double since = seconds();
    int bad = 0;
    for (size_t i = 0; i < want.size(); i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        if (a != b) {
            if (bad < 5)
                printf("  %s: element %zu is %.9g (0x%08x), the reference %.9g (0x%08x)\n",
                       what.c_str(), i, got[i], a, want[i], b);
            bad++;
        }
    }
    std::string verdict =
        bad ? ", " + std::to_string(bad) + " differ" : ", every bit the reference's";
    printf("%s %s: %zu values%s (%.1f s)\n", bad ? "FAIL" : "ok  ", what.c_str(), want.size(),
           verdict.c_str(), seconds() - since);
    since = seconds();
    if (bad) failures++;
}

// The exit status: 0 when every check passed.
inline int verdict() {
    if (failures) {
        printf("%d checks failed\n", failures);
        return 1;
    }
    printf("every kernel gave the reference's bits\n");
    return 0;
}

}  // namespace bits
