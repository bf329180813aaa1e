/*
 * startup.c - reset and fault handling for the Cortex-M4F firmware on MPS2
 * AN386: the vector table (placed first in flash by mps2_an386.ld), the reset
 * handler that prepares C (copy .data from flash, zero .bss, enable the FPU)
 * and calls main, and fault handlers that print which fault hit and stop with
 * a non-zero status instead of hanging, so a crash fails the test at once.
 */
#include <stdint.h>
#include <string.h>

#include "platform.h"

extern int main(void);

/* Symbols of the linker script. */
extern uint32_t __data_load__, __data_start__, __data_end__;
extern uint32_t __bss_start__, __bss_end__;
extern uint32_t __stack_top__;

void Reset_Handler(void);
void Default_Handler(void);
void HardFault_Handler(void);
void MemManage_Handler(void);
void BusFault_Handler(void);
void UsageFault_Handler(void);

/* System Control Block registers (Armv7-M ARM, B3.2). */
#define SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)
#define SCB_CFSR (*(volatile uint32_t *)0xE000ED28u)
#define SCB_SHCSR (*(volatile uint32_t *)0xE000ED24u)

static void fault(const char *what) {
    static const char hex[] = "0123456789abcdef";
    char msg[64];
    size_t n = 0;
    const char *p = "fatal: ";
    while (*p) msg[n++] = *p++;
    while (*what && n < 40) msg[n++] = *what++;
    p = " CFSR=0x";
    while (*p) msg[n++] = *p++;
    uint32_t cfsr = SCB_CFSR;
    for (int i = 28; i >= 0; i -= 4) msg[n++] = hex[(cfsr >> i) & 15u];
    msg[n++] = '\n';
    fw_write(msg, n);
    fw_exit(3);
}

void HardFault_Handler(void) { fault("HardFault"); }
void MemManage_Handler(void) { fault("MemManage fault"); }
void BusFault_Handler(void) { fault("BusFault"); }
void UsageFault_Handler(void) { fault("UsageFault"); }
void Default_Handler(void) { fault("unexpected interrupt"); }

/* 16 system exceptions; the firmware enables no external interrupt, so the
 * table stops there (VTOR stays 0: the table sits at the start of flash). */
__attribute__((section(".vectors"), used))
void (*const vector_table[16])(void) = {
    (void (*)(void))(uintptr_t)&__stack_top__,
    Reset_Handler,
    Default_Handler,     /* NMI */
    HardFault_Handler,
    MemManage_Handler,
    BusFault_Handler,
    UsageFault_Handler,
    0, 0, 0, 0,          /* reserved */
    Default_Handler,     /* SVCall */
    Default_Handler,     /* DebugMonitor */
    0,                   /* reserved */
    Default_Handler,     /* PendSV */
    Default_Handler,     /* SysTick */
};

void Reset_Handler(void) {
    /* Full access to CP10/CP11 (the FPU) before any float instruction. */
    SCB_CPACR |= (0xFu << 20);
    __asm__ volatile("dsb\n\tisb" ::: "memory");
    /* Report MemManage/BusFault/UsageFault separately, not as HardFault. */
    SCB_SHCSR |= (7u << 16);

    size_t data_bytes = (size_t)((uintptr_t)&__data_end__ - (uintptr_t)&__data_start__);
    memcpy(&__data_start__, &__data_load__, data_bytes);
    size_t bss_bytes = (size_t)((uintptr_t)&__bss_end__ - (uintptr_t)&__bss_start__);
    memset(&__bss_start__, 0, bss_bytes);

    fw_exit(main());
}
