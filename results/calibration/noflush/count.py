import bisect, sys, math
def count(path, jump_all=True):
    total=0; lst=[]; cmds=0
    def ins(name):
        nonlocal total
        i=bisect.bisect_left(lst,name)
        if i<len(lst): total+=i+1
        else: total+=len(lst)
        if i<len(lst) and lst[i]==name: return
        lst.insert(i,name)
    maxlen=0
    for line in open(path):
        line=line.rstrip('\n')
        if line.startswith('*'):
            maxlen=max(maxlen,len(lst)); lst=[]
        elif line.startswith(':'):
            cmds+=1; ins(line[1:].split()[0])
        elif line.startswith('-A') or line.startswith('-I') or line.startswith('-X') or line.startswith('-F'):
            cmds+=1; f=line.split(); ins(f[1])
            for k in ('-j','-g'):
                if k in f:
                    t=f[f.index(k)+1]
                    if jump_all or t.startswith('KUBE'): ins(t)
    return cmds,total,max(maxlen,len(lst))
prev=None
for n in (250,500,1000,2000):
    c,t,m=count(f'in-{n}.txt')
    s='' if prev is None else f' slope {math.log(t/prev[1])/math.log(n/prev[0]):.2f}'
    print(n,'commands',c,'strcmp',t,'max list',m,s); prev=(n,t)
